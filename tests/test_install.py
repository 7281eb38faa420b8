"""The installed project leaves transformers' own `kernels` probe alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, transformers
from transformers import DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM
from transformers.utils import is_kernels_available
import dsa_kernels
spec = importlib.util.find_spec("kernels")
print(is_kernels_available(), spec.origin if spec else None, dsa_kernels.__file__)
"""


def run_probe(cwd: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_kernels_installs_as_dsa_kernels_and_not_as_kernels(tmp_path):
    available, kernels_origin, ours = run_probe(tmp_path)
    assert available == "False" and kernels_origin == "None"
    assert Path(ours).parent == ROOT / "kernels"


def test_transformers_does_not_take_the_repository_kernels_dir_for_hf_kernels():
    # From the repository root, kernels/ is on sys.path as a plain directory; transformers must
    # still not treat it as the Hugging Face kernels package (it checks the distribution).
    available, _, _ = run_probe(ROOT)
    assert available == "False"


def test_transformers_loads_a_project_checkpoint(checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint("glm_moe_dsa"))
    assert type(model).__name__ == "GlmMoeDsaForCausalLM"
