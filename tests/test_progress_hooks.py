"""exporter/progress/hooks.py's import hook, in a fresh interpreter each (it edits sys.meta_path): a module
to patch is patched when it is imported, even after a library looked for it without importing it
(`importlib.util.find_spec`) or an import of it failed once; once every module is patched the hook leaves
sys.meta_path. The frameworks' own patches are tested with their frameworks (test_progress_trl.py,
test_progress_verl.py, test_progress_openrlhf.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import REPO

# A package named as OpenRLHF's (tests/test_progress_openrlhf.py says why not OpenRLHF itself); the first
# import of its trainer module fails where `FAIL_ONCE` exists (a missing dependency, since installed).
SCRIPT = """
    import importlib.util, json, pathlib, sys
    from exporter.progress import hooks

    root = pathlib.Path(sys.argv[1])
    (root / "openrlhf" / "trainer").mkdir(parents=True)
    (root / "openrlhf" / "__init__.py").write_text("")
    (root / "openrlhf" / "trainer" / "__init__.py").write_text("")
    fail_once = root / "FAIL_ONCE"
    (root / "openrlhf" / "trainer" / "ppo_trainer.py").write_text(
        "import pathlib\\n"
        f"if pathlib.Path({str(fail_once)!r}).exists():\\n"
        f"    pathlib.Path({str(fail_once)!r}).unlink()\\n"
        "    raise ImportError('a dependency is missing')\\n"
        "class BasePPOTrainer:\\n"
        "    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):\\n"
        "        pass\\n")
    sys.path.insert(0, str(root))
    if sys.argv[2] == "alone":  # the only module to patch
        hooks.PATCHES = {hooks.OPENRLHF_MODULE: hooks.PATCHES[hooks.OPENRLHF_MODULE]}
    hooks.setup()
    if sys.argv[2] == "probe":
        assert importlib.util.find_spec("openrlhf.trainer.ppo_trainer") is not None
    elif sys.argv[2] == "fail":
        fail_once.touch()
        try:
            import openrlhf.trainer.ppo_trainer
        except ImportError:
            pass
        assert "openrlhf.trainer.ppo_trainer" not in sys.modules
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    print(json.dumps({"patched": getattr(BasePPOTrainer.save_logs_and_checkpoints, "_raypulse", False),
                      "hooked": any(isinstance(finder, hooks._PatchOnImport) for finder in sys.meta_path)}))
"""


def patched_after(tmp_path, case: str) -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), case], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_module_looked_for_before_its_import_is_patched_when_imported(tmp_path):
    # Patched; the hook stays for the frameworks not imported (transformers, verl).
    assert patched_after(tmp_path, "probe") == {"patched": True, "hooked": True}


def test_a_module_whose_first_import_failed_is_patched_when_imported_again(tmp_path):
    assert patched_after(tmp_path, "fail")["patched"] is True


def test_once_every_module_is_patched_the_hook_leaves_the_import_system(tmp_path):
    assert patched_after(tmp_path, "alone") == {"patched": True, "hooked": False}
