"""float64 exp, log and the functions the codec builds on them, from IEEE basic operations
alone (docs/compress.md, "Files that travel").

torch's float64 ``exp``, ``log``, ``log1p``, ``expm1``, ``tanh``, ``sigmoid`` and ``logsigmoid`` are not
the same function on every machine: with ATen's baseline kernels they call the C library's
libm, and glibc picks an FMA or a non-FMA variant of each by the CPU it finds (they differ in
the last bit for a few inputs in ten thousand); ATen's AVX2 and AVX-512 kernels use SLEEF's
instead; a sum's order follows the kernel's vector width; a float64 ``bmm`` is MKL's DGEMM.
numpy's ``exp`` and ``log`` have CPU-dependent variants too. The decoder must compute the
encoder's probabilities bit for bit, so the codec computes them here, on numpy float64 arrays,
where every step is one IEEE 754 basic operation (+, −, ×, /), or an exact one (comparison,
min, max, floor, a power of two built from its bits, ``np.where``):

* each basic operation is correctly rounded on every IEEE machine, whatever the CPU or the
  loop that runs it (scalar or SIMD, any width): one numpy call is one rounding;
* no a·b + c is left for a compiler or a library to contract into one FMA (a different
  rounding): each product and each sum is its own numpy call;
* sums run in one fixed order, a pairwise tree over the summed axis (``tree_sum``), not
  numpy's or torch's reductions, whose blocking depends on the vector width.

So the same float64 inputs give the same bits on any CPU, under any libm. (numpy, not torch:
one numpy call on the codec's small arrays costs about a microsecond, a torch call several,
and these functions are dozens of calls.) The algorithms are fdlibm's (Sun Microsystems, 1993:
e_exp.c, e_log.c), accurate to an ulp, and the classic log1p, expm1 and tanh formulas on top
of them, to a few ulps: tests/codec/test_codec_glibc.py holds them to 4 ulps of glibc's. They are
not correctly rounded; what matters is that they are one function everywhere.
"""

from __future__ import annotations

import numpy as np

# ln 2 in two parts (fdlibm's ln2HI, ln2LO): LN2_HI holds ln 2's first 32 significant bits and
# ends in 21 zero bits, so k·LN2_HI is exact for every integer |k| < 2**21 (every k below), and
# x − k·LN2_HI is exact where it is small (Cody and Waite's reduction); LN2_LO is ln 2 − LN2_HI
# to float64's precision.
LN2_HI = 6.93147180369123816490e-01  # 0x3FE62E42FEE00000
LN2_LO = 1.90821492927058770002e-10  # 0x3DEA39EF35793C76
INV_LN2 = 1.44269504088896338700e+00  # 1 / ln 2, to pick k = round(x / ln 2)
# fdlibm e_exp.c's P1..P5: the minimax polynomial R, on |r| <= ln2 / 2, in
# r·(e^r + 1)/(e^r − 1) = 2 + r²·R(r²), with error below 2**-59 there.
EXP_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
         -1.65339022054652515390e-06, 4.13813679705723846039e-08)
# fdlibm e_log.c's Lg1..Lg7: the minimax polynomial R, on s² <= 0.1716², in
# log(1 + f) = 2s + s·s²·R(s²), s = f / (2 + f), with error below 2**-58.45 there.
LOG_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
          2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
          1.479819860511658591e-01)
# log reduces the significand into [sqrt(2)/2, sqrt(2)), so |f| <= sqrt(2) − 1 and s² <= 0.1716².
SQRT2 = 1.41421356237309504880
# float64's layout: 52 stored significand bits below 11 exponent bits, biased by 1023.
SIGNIFICAND_BITS = 52
EXPONENT_BIAS = 1023
SIGNIFICAND_MASK = (1 << SIGNIFICAND_BITS) - 1
# exp saturates: its argument is clamped to [EXP_LOW, EXP_HIGH], so that k = round(x / ln 2) stays
# within float64's normal exponents (-1021..1023) and 2**k is built from its bits in one step, with
# no overflow or subnormal anywhere. e^-708 (3.3e-308) then stands for anything smaller and e^709
# (8.2e307) for anything larger: in the codec a mass or weight of 1e-307 is 0 (every value keeps
# 2**-24 anyway) and 1 + e^709 as good as infinite (a sigmoid of 1e-308, not 0).
EXP_LOW = -708.0
EXP_HIGH = 709.0
K_LOW = -1021.0  # round(EXP_LOW / ln 2): the least k
# Below float64's smallest normal number the exponent field is 0: such inputs of log are scaled
# up by 2**54 first (exactly), which makes them normal.
SMALLEST_NORMAL = 2.0 ** -1022
SUBNORMAL_SCALE = 54


def two_to(k: np.ndarray) -> np.ndarray:
    """int64 k with -1022 <= k <= 1023 -> 2**k in float64, exactly, from its bits."""
    return ((k + EXPONENT_BIAS) << SIGNIFICAND_BITS).view(np.float64)


def horner(x: np.ndarray, coefficients: tuple[float, ...]) -> np.ndarray:
    """c0 + x·(c1 + x·(c2 + ...)): one product, then one sum, per coefficient."""
    value = x * coefficients[-1]
    for c in reversed(coefficients[1:-1]):
        value = x * (value + c)
    return value + coefficients[0]


def exp(x: np.ndarray) -> np.ndarray:
    """e^x, float64, saturating beyond [EXP_LOW, EXP_HIGH] (fdlibm e_exp.c): x = k·ln 2 + r,
    |r| <= ln 2 / 2, e^x = 2**k·e^r, e^r from the rational form 1 + 2r / (R − r) (fdlibm's
    ``c``). NaN gives NaN."""
    x = np.minimum(np.maximum(x, EXP_LOW), EXP_HIGH)  # (both keep a NaN)
    k = np.floor(x * INV_LN2 + 0.5)
    hi = x - k * LN2_HI  # exact
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * horner(t, EXP_P)
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    # fmax drops a NaN k (a NaN x, whose y is NaN already) for a harmless one, K_LOW
    return y * two_to(np.fmax(k, K_LOW).astype(np.int64))


def log(x: np.ndarray) -> np.ndarray:
    """The natural logarithm, float64 (fdlibm e_log.c): x = 2**e·(1 + f), 1 + f in
    [sqrt(2)/2, sqrt(2)), log x = e·ln 2 + log(1 + f). log 0 = −inf, log inf = inf; x < 0 and
    NaN give NaN."""
    ordinary = (x >= SMALLEST_NORMAL) & (x < np.inf)  # positive, normal and finite (a NaN is not)
    if ordinary.all():
        return log_normal(x, 0)
    subnormal = (x > 0) & (x < SMALLEST_NORMAL)
    scaled = np.where(ordinary | subnormal, x * np.where(subnormal, 2.0 ** SUBNORMAL_SCALE, 1.0), 1.0)
    value = log_normal(scaled, np.where(subnormal, SUBNORMAL_SCALE, 0))
    special = np.where(x == 0, -np.inf, np.where(x == np.inf, np.inf, np.nan))
    return np.where(ordinary | subnormal, value, special)


def log_normal(x: np.ndarray, scale: np.ndarray | int) -> np.ndarray:
    """log(x / 2**scale) for positive, normal, finite x: ``log``'s reduction and polynomial."""
    bits = x.view(np.int64)
    e = (bits >> SIGNIFICAND_BITS) - EXPONENT_BIAS - scale
    m = ((bits & SIGNIFICAND_MASK) | (EXPONENT_BIAS << SIGNIFICAND_BITS)).view(np.float64)  # [1, 2)
    big = m >= SQRT2
    m = np.where(big, m * 0.5, m)
    f = m - 1.0  # exact (Sterbenz: m within a factor 2 of 1)
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * (f * f)
    r = z * horner(z, LOG_LG)
    dk = (e + big).astype(np.float64)
    return dk * LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN2_LO)) - f)


def at_once(function, *arrays: np.ndarray) -> list[np.ndarray]:
    """``function`` (elementwise) of several arrays in one call on their elements laid end to end:
    the same values, in far fewer numpy calls (on the codec's small arrays a call's cost is mostly
    its own, not its elements')."""
    flat = function(np.concatenate([array.ravel() for array in arrays]))
    ends = np.cumsum([array.size for array in arrays])
    return [part.reshape(array.shape) for part, array in zip(np.split(flat, ends[:-1]), arrays)]


def log1p(x: np.ndarray) -> np.ndarray:
    """log(1 + x), float64, x >= -1, accurate for small x: with u = 1 + x rounded,
    log(u)·(x / (u − 1)) (Goldberg, "What every computer scientist should know about
    floating-point arithmetic", 1991, theorem 4: the rounding of u cancels), and x itself where u
    rounds to 1."""
    u = 1.0 + x
    d = u - 1.0
    same = d == 0
    value = log(u) * (x / np.where(same, 1.0, d))
    return np.where(same, x, np.where(u == np.inf, u, value))


def expm1(x: np.ndarray) -> np.ndarray:
    """e^x − 1, float64, accurate for small x: with u = e^x rounded, (u − 1)·(x / log u) (Kahan's
    formula: the rounding of u cancels), x itself where u rounds to 1."""
    u = exp(x)
    return expm1_from(x, u, log(u))


def expm1_from(x: np.ndarray, u: np.ndarray, log_u: np.ndarray) -> np.ndarray:
    """``expm1(x)`` given u = ``exp(x)`` and its ``log`` (computed with other arrays at once)."""
    d = u - 1.0
    same = u == 1.0
    value = d * (x / np.where(same, 1.0, log_u))
    return np.where(same, x, np.where(d == -1.0, d, value))


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh x, float64: with m = expm1(−2|x|) (no cancellation near 0, exactly −1 where e^−2|x|
    underflows), −m / (2 + m), given x's sign (``copysign``: exact, and tanh(−0) = −0)."""
    m = expm1(-2.0 * np.abs(x))
    return np.copysign(-m / (2.0 + m), x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^−x), float64."""
    return 1.0 / (1.0 + exp(-x))


def logsigmoid(x: np.ndarray) -> np.ndarray:
    """log σ(x) = min(x, 0) − log(1 + e^−|x|), float64 (torch's formula)."""
    return logsigmoid_from(x, exp(-np.abs(x)))


def logsigmoid_from(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``logsigmoid(x)`` given e = ``exp(−|x|)`` (computed with other arrays at once)."""
    return np.minimum(x, 0.0) - log1p(e)


def tree_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The sum over ``axis`` in one fixed order: its first and second halves added elementwise
    (an odd last element then added to the last of those sums) until one is left."""
    axis = axis % x.ndim
    before = (slice(None),) * axis
    while x.shape[axis] > 1:
        width, half = x.shape[axis], x.shape[axis] // 2
        pairs = x[(*before, slice(0, half))] + x[(*before, slice(half, 2 * half))]
        if width % 2:
            pairs[(*before, slice(half - 1, half))] += x[(*before, slice(width - 1, width))]
        x = pairs
    return x[(*before, 0)]


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64: e^(x − max) over its ``tree_sum``."""
    e = exp(x - x.max(axis=-1, keepdims=True))
    return e / tree_sum(e, -1)[..., None]


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, float64: (x − max) − log of the ``tree_sum`` of e^(x − max)."""
    return softmax_and_log(x)[1]


def softmax_and_log(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(softmax, log_softmax) over the last axis, float64, from one e^(x − max) and its sum."""
    shifted = x - x.max(axis=-1, keepdims=True)
    e = exp(shifted)
    total = tree_sum(e, -1)[..., None]
    return e / total, shifted - log(total)
