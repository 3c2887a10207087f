"""Stand-in for ``torchvision.ops.boxes``: every attribute is a placeholder (see .ci/sglang-standins)."""

from torchvision._standin import module_getattr

__getattr__ = module_getattr(__name__)
