import subprocess
import sys


def test_import_lr_config_does_not_import_torch():
    code = "import sys, lr_config; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
