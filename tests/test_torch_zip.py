"""pytorch_model.bin read without torch (flax_encoder.families.torch_zip): the arrays torch.load
gives, for every dtype a checkpoint holds and for tensors that are views of another's storage;
anything beyond tensors refused in one line, never run; and a directory of it loaded with
load_hf in a process that never imports torch."""

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flax_encoder.families.torch_zip import TorchZipError, read_torch_zip  # noqa: E402
from tests.runs import ROOT  # noqa: E402

pytestmark = pytest.mark.library


def test_every_tensor_reads_as_torch_load_reads_it(tmp_path):
  base = torch.randn(6, 4)
  state = collections.OrderedDict(
      plain=torch.randn(3, 5), transposed=base.t(), rows=base[2:4], half=torch.randn(7).half(),
      bfloat16=torch.randn(2, 3).bfloat16(), double=torch.randn(2).double(),
      ids=torch.arange(5)[None], scalar=torch.tensor(3.5),
      parameter=torch.nn.Parameter(torch.randn(2)), flags=torch.tensor([True, False]))
  file = str(tmp_path / "pytorch_model.bin")
  torch.save(state, file)
  ours = read_torch_zip(file)
  theirs = torch.load(file, weights_only=True)
  assert list(ours) == list(theirs)
  for name, tensor in theirs.items():
    want = tensor.detach()
    got = ours[name]
    assert got.shape == tuple(want.shape), name
    if want.dtype == torch.bfloat16:
      assert got.dtype.name == "bfloat16"
      want, got = want.float(), got.astype(np.float32)
    assert got.dtype == want.numpy().dtype, name
    np.testing.assert_array_equal(got, want.numpy(), err_msg=name)


class Payload:
  def __reduce__(self):
    return (os.system, ("touch pwned",))


@pytest.mark.parametrize("entry, named", [
    (Payload(), "posix.system"), (collections.Counter(a=1), "collections.Counter"),
])
def test_anything_beyond_tensors_is_refused_in_one_line_and_never_run(entry, named, tmp_path,
                                                                      monkeypatch):
  monkeypatch.chdir(tmp_path)
  file = str(tmp_path / "evil.bin")
  torch.save({"weight": torch.ones(2), "extra": entry}, file)
  with pytest.raises(TorchZipError) as e:
    read_torch_zip(file)
  assert str(e.value).startswith(f"{file}: not a state dict of tensors: ")
  assert named in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("content, said", [
    (b"not a zip at all", "not a zip archive (torch.save's format since PyTorch 1.6)"),
    (None, "not a zip archive"),  # a truncated archive
])
def test_a_file_that_is_no_archive_is_one_line(content, said, tmp_path):
  file = str(tmp_path / "pytorch_model.bin")
  if content is None:
    torch.save({"w": torch.ones(100)}, file)
    content = open(file, "rb").read()[:200]
  open(file, "wb").write(content)
  with pytest.raises(TorchZipError) as e:
    read_torch_zip(file)
  assert said in str(e.value) and "\n" not in str(e.value)


def test_a_bin_directory_loads_without_torch(tmp_path):
  from flax_encoder import families
  config = families.get("bert").preset(64, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_len=32)
  import flax.linen as nn
  import jax

  from flax_encoder import Encoder
  params = nn.unbox(Encoder(config).init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32))[
      "params"])
  state = families.to_hf_state_dict({"params": params}, config, "bert")
  torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
             str(tmp_path / "pytorch_model.bin"))
  (tmp_path / "config.json").write_text(json.dumps(families.hf_config(config, "bert")))
  code = ("import sys\nimport numpy as np\nfrom flax_encoder.families import read_hf\n"
          f"model = read_hf({str(tmp_path)!r})\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n"
          "print(model.family, model.config.n_layers)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["bert", "2"]
