"""Import-only stand-in for torchvision (.ci/sglang-standins/README.md): every attribute is a placeholder."""

from torchvision._standin import module_getattr

__version__ = "0.0.0+standin"
__getattr__ = module_getattr(__name__)
