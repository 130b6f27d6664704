"""The errors eqsat raises: each says what was wrong and where, in one paragraph."""


class EqsatError(Exception):
    """Base class of eqsat's errors."""


class EqsatWarning(UserWarning):
    """The optimized program disagreed with the original, or could not be built; the original runs."""


class RuleError(EqsatError):
    """A rule file or string that does not load: names the file and line."""


class ShapeConflictError(EqsatError):
    """A rewrite equated tensors of different shapes: names the rule."""


class CaptureError(EqsatError):
    """Kept for code that catches it; eqsat no longer raises it: an error while tracing the function reaches the
    caller with jax's own type (TypeError for a non-array argument, as jax.jit raises), with a note."""
