"""RAGEN's `python scripts/download_data.py`, without the download: the data are built here, locally.

RAGEN's version fetched its parquet files of first observations from the Hugging Face Hub. Training reads
no data files (each step draws new start states from `trainer.seed`); the files serve inspection, fixed
evaluation sets and SFT, and `scripts/create_data.sh` builds the same from the environments themselves:
`data/<tag>/{train,test}.parquet`. This runs it; extra arguments go to `python -m ragen.create_data`
(`--train-size 100`, `--output DIR`, ...).
"""

import subprocess
import sys
from pathlib import Path


def main() -> None:
    script = Path(__file__).with_name("create_data.sh")
    print("download_data.py downloads nothing: building the data locally with scripts/create_data.sh "
          "(python -m ragen.create_data)", flush=True)
    sys.exit(subprocess.call(["bash", str(script), *sys.argv[1:]]))


if __name__ == "__main__":
    main()
