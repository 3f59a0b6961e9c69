"""float64 exp, log and the functions the codec builds on them, from IEEE basic operations
alone (docs/compress.md, "Files that travel").

torch's float64 ``exp``, ``log``, ``log1p``, ``expm1``, ``sigmoid`` and ``logsigmoid`` are not
the same function on every machine: with ATen's baseline kernels they call the C library's
libm, and glibc picks an FMA or a non-FMA variant of each by the CPU it finds (they differ in
the last bit for a few inputs in ten thousand); ATen's AVX2 and AVX-512 kernels use SLEEF's
instead; a sum's order follows the kernel's vector width; a float64 ``bmm`` is MKL's DGEMM.
The decoder must compute the encoder's probabilities bit for bit, so the codec computes them
here, where every step is one IEEE 754 basic operation (+, −, ×, /) on float64 tensors, or an
exact one (comparison, max, floor, a power of two built from its bits, ``torch.where``):

* each basic operation is correctly rounded on every IEEE machine, whatever the CPU or the
  kernel that runs it (scalar or vector, any width): one torch call is one rounding;
* no a·b + c is left for a compiler or a library to contract into one FMA (a different
  rounding): each product and each sum is its own torch call. (``a + b`` and ``a - b`` reach
  ATen's add kernel, which computes a + alpha·b, with an FMA on AVX2 machines; alpha = ±1
  makes alpha·b exact, so the FMA rounds once, as the addition does.)
* sums run in one fixed order, a pairwise tree over the summed dimension (``tree_sum``),
  not torch's reductions, whose order depends on the kernel's vector width.

So the same float64 inputs give the same bits on any x86-64 or ARM CPU, under any of ATen's
kernels and any libm. The functions are fdlibm's algorithms (Sun Microsystems, 1993: e_exp.c,
e_log.c), accurate to within an ulp or two (tests/codec/test_float64.py compares them with
libm's to 4 ulps), not correctly rounded: what matters is that they are one function
everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

# ln 2 in two parts (fdlibm's ln2HI, ln2LO): LN2_HI holds ln 2's first 32 significant bits and
# ends in 21 zero bits, so k·LN2_HI is exact for every integer |k| < 2**21 (every k below), and
# x − k·LN2_HI is exact where it is small (Cody and Waite's reduction); LN2_LO is ln 2 − LN2_HI
# to float64's precision.
LN2_HI = 6.93147180369123816490e-01  # 0x3FE62E42FEE00000
LN2_LO = 1.90821492927058770002e-10  # 0x3DEA39EF35793C76
INV_LN2 = 1.44269504088896338700e+00  # 1 / ln 2, to pick k = round(x / ln 2)
# fdlibm e_exp.c's P1..P5: the minimax polynomial, on |r| <= ln2 / 2, of R(r²) in
# r·(e^r + 1)/(e^r − 1) = 2 + r²·R(r²), with error below 2**-59 there.
EXP_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
         -1.65339022054652515390e-06, 4.13813679705723846039e-08)
# fdlibm e_log.c's Lg1..Lg7: the minimax polynomial, on 0 <= s² <= 0.1716², of R(s²) in
# log(1 + f) = 2s + s·R(s²), s = f / (2 + f), with error below 2**-58.45 there.
LOG_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
          2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
          1.479819860511658591e-01)
SQRT2 = 1.41421356237309504880  # the significand is reduced into [sqrt(2)/2, sqrt(2)): |f| <= 0.4142
# float64's layout: 52 stored significand bits below 11 exponent bits, biased by 1023.
SIGNIFICAND_BITS = 52
EXPONENT_BIAS = 1023
SIGNIFICAND_MASK = (1 << SIGNIFICAND_BITS) - 1
# exp's argument is clamped to ±EXP_LIMIT: e^1100 overflows float64 (largest e^709.78) and e^-1100
# underflows to 0 (smallest subnormal e^-744.4), so the clamp changes no result, and keeps k within
# ±1587, whose halves are powers of two of normal float64 (exponents ±1022).
EXP_LIMIT = 1100.0
# Below float64's smallest normal number the exponent field is 0: such inputs of log are scaled
# up by 2**54 first (exactly), making them normal.
SMALLEST_NORMAL = 2.0 ** -1022
SUBNORMAL_SCALE = 54


def two_to(k: Tensor) -> Tensor:
    """(...) int64 k with |k| <= 1022 -> 2**k in float64, exactly, from its bits."""
    return ((k + EXPONENT_BIAS) << SIGNIFICAND_BITS).view(torch.float64)


def horner(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """c0 + x·(c1 + x·(c2 + ...)): one product, then one sum, per coefficient."""
    value = x * coefficients[-1]
    for c in reversed(coefficients[1:-1]):
        value = x * (value + c)
    return value + coefficients[0]


def exp(x: Tensor) -> Tensor:
    """e^x, float64 (fdlibm e_exp.c): x = k·ln 2 + r, |r| <= ln 2 / 2, e^x = 2**k·e^r, and e^r from
    the rational form 1 + 2r / (R − r) (fdlibm's ``c``). NaN gives NaN, ±inf e^±inf."""
    x = x.clamp(-EXP_LIMIT, EXP_LIMIT)
    k = torch.floor(x * INV_LN2 + 0.5)
    hi = x - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * horner(t, EXP_P)
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    k = k.nan_to_num(0.0).long()  # (a NaN x has a NaN y already)
    half = torch.div(k, 2, rounding_mode="floor")
    # two exact products, unless the result is beyond float64's normal range (then overflow to
    # inf, or subnormal: rounded, the same everywhere)
    return (y * two_to(half)) * two_to(k - half)


def log(x: Tensor) -> Tensor:
    """The natural logarithm, float64 (fdlibm e_log.c): x = 2**e·(1 + f), 1 + f in
    [sqrt(2)/2, sqrt(2)), log x = e·ln 2 + log(1 + f). log 0 = −inf, log inf = inf, NaN and
    x < 0 give NaN."""
    subnormal = x < SMALLEST_NORMAL
    scaled = torch.where(subnormal, x * 2.0 ** SUBNORMAL_SCALE, x)
    bits = scaled.view(torch.int64)
    e = (bits >> SIGNIFICAND_BITS) - EXPONENT_BIAS - torch.where(subnormal, SUBNORMAL_SCALE, 0)
    m = ((bits & SIGNIFICAND_MASK) | (EXPONENT_BIAS << SIGNIFICAND_BITS)).view(torch.float64)  # [1, 2)
    big = m >= SQRT2
    m = torch.where(big, m * 0.5, m)
    e = torch.where(big, e + 1, e)
    f = m - 1.0  # exact (Sterbenz: m within a factor 2 of 1)
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * (f * f)
    r = z * horner(z, LOG_LG)
    dk = e.double()
    value = dk * LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN2_LO)) - f)
    value = torch.where(x == 0, float("-inf"), value)
    value = torch.where(x == float("inf"), float("inf"), value)
    return torch.where((x < 0) | torch.isnan(x), float("nan"), value)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), float64, accurate for small x: with u = 1 + x rounded, log(u)·x / (u − 1)
    (Goldberg, "What every computer scientist should know about floating-point arithmetic",
    1991, theorem 4: the rounding of u cancels), and x itself where u rounds to 1."""
    u = 1.0 + x
    d = u - 1.0
    value = log(u) * (x / torch.where(d == 0, 1.0, d))
    return torch.where(d == 0, x, torch.where(u == float("inf"), u, value))


def expm1(x: Tensor) -> Tensor:
    """e^x − 1, float64, accurate for small x: with u = e^x rounded, (u − 1)·x / log u (Kahan's
    formula), x itself where u rounds to 1, −1 where u − 1 does."""
    u = exp(x)
    d = u - 1.0
    lu = log(u)
    value = d * (x / torch.where(lu == 0, 1.0, lu))
    value = torch.where(d == -1.0, -1.0, value)
    value = torch.where(u == float("inf"), u, value)
    return torch.where(u == 1.0, x, value)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e^−x), float64."""
    return 1.0 / (1.0 + exp(-x))


def logsigmoid(x: Tensor) -> Tensor:
    """log σ(x) = min(x, 0) − log(1 + e^−|x|), float64 (as torch computes it)."""
    return torch.clamp(x, max=0.0) - log1p(exp(-x.abs()))


def tree_sum(x: Tensor, dim: int) -> Tensor:
    """The sum over ``dim`` in one fixed order: the dimension padded with zeros to a power of two,
    then its halves added pairwise until one is left (each addition one rounding)."""
    x = x.movedim(dim, -1)
    width = x.shape[-1]
    padded = 1 << max(width - 1, 0).bit_length()
    if padded != width:
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], padded - width)], dim=-1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dimension, float64: e^(x − max) over its ``tree_sum``."""
    e = exp(x - x.amax(dim=-1, keepdim=True))
    return e / tree_sum(e, -1)[..., None]


def log_softmax(x: Tensor) -> Tensor:
    """log softmax over the last dimension, float64: (x − max) − log of the sum of e^(x − max)."""
    shifted = x - x.amax(dim=-1, keepdim=True)
    return shifted - log(tree_sum(exp(shifted), -1))[..., None]
