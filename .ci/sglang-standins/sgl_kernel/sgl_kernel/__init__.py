"""Import-only stand-in for sgl_kernel (.ci/sglang-standins/README.md): every attribute is a placeholder.

It registers no ``torch.ops.sgl_kernel`` operator, so SGLang's probe for its CPU kernels
(``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``) says no and SGLang uses its plain torch layers.
"""

from sgl_kernel._standin import module_getattr

__version__ = "0.0.0+standin"
__getattr__ = module_getattr(__name__)
