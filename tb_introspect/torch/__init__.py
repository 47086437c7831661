"""The PyTorch writer side: ``Introspector`` logs the four views of a PyTorch training loop
in the format the Introspect tab reads (no TensorFlow needed).

    from tb_introspect.torch import Introspector
"""

from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.torch.introspector import Introspector

__all__ = ["FindingStop", "Introspector"]
