"""The one error of model files: a checkpoint or weights folder that is missing, unreadable, not
imagetx's, or does not fit its configuration."""

from ..errors import UserError


class CheckpointError(UserError):
    """A checkpoint or weights folder that is missing, unreadable, not imagetx's, or does not fit
    its config. Its message is one line naming the file and the fix."""
