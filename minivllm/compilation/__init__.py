"""minivllm's torch.compile integration (VLLM_COMPILE's backend, caches, AOT traces).

Importing the package imports Dynamo and Inductor, without Triton where no GPU can
use it (`minivllm.kernels.torch_compiler`): every module here needs them, and this
runs before any of them does.
"""

from minivllm.kernels.torch_compiler import import_torch_compiler

import_torch_compiler()
