"""The scheduler and the KV cache manager must import without torch."""

from __future__ import annotations

import subprocess
import sys


def test_core_imports_do_not_pull_torch() -> None:
    code = (
        "import sys\n"
        "import minivllm.scheduler.scheduler, minivllm.kv_cache.manager\n"
        "import minivllm.scheduler, minivllm.kv_cache\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
