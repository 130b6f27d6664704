"""The errors eqsat raises: each says what was wrong and where, in one paragraph."""


class EqsatError(Exception):
    """Base class of eqsat's errors."""


class RuleError(EqsatError):
    """A rule file or string that does not load: names the file and line."""


class ShapeConflictError(EqsatError):
    """A rewrite equated tensors of different shapes: names the rule."""


class CaptureError(EqsatError):
    """The function could not be traced or its arguments are not arrays."""
