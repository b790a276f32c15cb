"""normplug: normalization layers, Transformer architectures and a criterion for fairseq.

Load it with ``fairseq-train --user-dir normplug`` (or the path printed by
``normplug-path``). fairseq imports ``models/`` of a user dir by itself but not
criterions, so everything is imported here explicitly.
"""
__version__ = "0.1.0"

from . import compat  # noqa: E402

compat.allow_fairseq_checkpoints()

from . import errors  # noqa: E402

errors.install_excepthook()  # one-line errors for damaged checkpoints / data dirs

from . import norms  # noqa: E402,F401

try:  # the layers work without fairseq; the plugin parts need it
    import fairseq  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without fairseq
    pass
else:
    from . import models, criterions  # noqa: F401
