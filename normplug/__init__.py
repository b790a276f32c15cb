"""normplug: normalization layers, Transformer architectures and a criterion for fairseq.

Load it with ``fairseq-train --user-dir normplug`` (or the path printed by
``normplug-path``). fairseq imports a user dir's ``models/`` by itself but not its
criterions, so everything is imported here. Importing registers the plugin's
components and allow-lists the types fairseq checkpoints pickle; nothing else.
"""
__version__ = "0.2.0"

from .checkpoints import allow_fairseq_checkpoints  # noqa: E402

allow_fairseq_checkpoints()

from . import norms  # noqa: E402,F401

try:  # the norms work without fairseq; the plugin parts need it
    import fairseq  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without fairseq
    pass
else:
    from . import models, criterions  # noqa: F401
