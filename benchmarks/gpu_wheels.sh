#!/usr/bin/env bash
# Builds .whl/: the wheels a GPU machine with Python 3.12 and a CUDA jax install needs beyond
# what such an image usually holds (jax, flax, optax, chex, orbax, torch, absl, etils, numpy,
# protobuf, pyyaml, pyarrow, sentencepiece, tokenizers, tqdm, matplotlib): grain and what it
# needs, ml_collections, tensorboard and what it needs, zstandard, qwix (int8), and this project.
# Then checks that they
# install for Python 3.12 on manylinux x86_64 without anything else.
#
#   bash benchmarks/gpu_wheels.sh            # here, from the repository root
#   # there, from the repository root, with .whl/ beside it:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#     PYTHONPATH=/tmp/site python3 -m benchmarks.accelerator --out results
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
# Versions as this checkout is tested with; their own needs the image has (see above).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl \
  grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 ml_collections==1.1.0 \
  tensorboard==2.21.0 tensorboard-data-server==0.7.2 grpcio==1.85.3 markdown==3.11.3 \
  werkzeug==3.1.9 markupsafe==3.0.4 zstandard==0.25.0 qwix==0.1.8
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl . 2>/dev/null
# The check: every wheel installs for CPython 3.12 on x86_64 Linux, and nothing is missing
# among what they ask for that the folder does not hold either.
python3 -m pip install -q --dry-run --no-index --no-deps --ignore-installed \
  --target /tmp/gpu-wheels-check --python-version 3.12 --implementation cp \
  "${platforms[@]}" --only-binary=:all: .whl/*.whl
python3 - <<'EOF'
import glob, re, zipfile
IMAGE = {"absl-py", "cloudpickle", "etils", "numpy", "protobuf", "pyyaml", "packaging", "jax",
         "flatbuffers",
         "flax", "optax", "orbax-checkpoint", "chex", "typing-extensions", "psutil", "tqdm",
         "matplotlib", "sentencepiece", "tokenizers", "torch", "safetensors", "pytest",
         "pyarrow", "msgpack", "importlib-resources", "zipp", "fsspec", "humanize",
         "pillow", "setuptools",  # matplotlib's and torch's
         "jaxlib", "opt-einsum"}  # jax's
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = IMAGE | {norm(w.split("/")[-1].split("-")[0]) for w in glob.glob(".whl/*.whl")}
missing = set()
for wheel in glob.glob(".whl/*.whl"):
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
      if line.startswith("Requires-Dist:") and "extra ==" not in line:
        req = norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0])
        if 'python_version < "3.1' not in line and req not in have:
          missing.add(f"{req} (for {wheel.split('/')[-1]})")
if missing:
  raise SystemExit(f"wheels ask for what neither the folder nor the image has: {sorted(missing)}")
print(f"{len(glob.glob('.whl/*.whl'))} wheels in .whl/ install for CPython 3.12, x86_64")
EOF
du -sh .whl
