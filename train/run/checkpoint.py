"""Orbax checkpoints that are atomic, verified on restore and never silently lost.

Each save is one composite checkpoint: the train state (params, optimizer state, step, rng) and
a JSON record of the step, the config and the data iterator's position. Every process iterates
over the same global batches, so that position is one for the whole run and a checkpoint
resumes with any number of processes. Orbax writes it into a temporary directory in a
background thread and renames it when complete, so a killed run leaves no half-written
checkpoint behind.

Integrity: in that background thread, once every process has written its files and before the
rename, the primary process records the SHA-256 of every file of the checkpoint in
`sha256sums.json` inside it, reading the files in chunks (no process holds the whole state, and
the training loop does not wait for it). Orbax's own `_CHECKPOINT_METADATA`, which it rewrites
at the rename, is left out. On restore, the processes split the files between them, each
checking its share, so verifying costs each the bytes of its share, whatever mesh or number of
processes wrote the checkpoint; a single flipped bit in any recorded file fails it. A
checkpoint that fails verification is reported, moved aside to `checkpoints_corrupt/` (kept,
never deleted) and the next older one is tried; one that verifies but does not fit the run
restoring it is an error, and stays where it is.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import sys
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from train.errors import RunError
from train.files import sha256_file

MANIFEST = "sha256sums.json"
# Orbax rewrites _CHECKPOINT_METADATA at the commit, after the manifest is written.
_UNRECORDED = {MANIFEST, "_CHECKPOINT_METADATA"}


def checkpoint_files(directory: str) -> list[str]:
  """The files of the checkpoint in `directory` that its manifest records, relative, sorted."""
  files = []
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.relpath(os.path.join(root, name), directory)
      if path not in _UNRECORDED:
        files.append(path)
  return sorted(files)


def write_manifest(directory: str) -> None:
  digests = {f: sha256_file(os.path.join(directory, f)) for f in checkpoint_files(directory)}
  with open(os.path.join(directory, MANIFEST), "w") as f:
    json.dump(digests, f, indent=0)


def verify_share(directory: str, index: int, count: int) -> str | None:
  """Checks this process's share (every `count`-th file from `index`) of the checkpoint in
  `directory` against its manifest; returns what is wrong, or None."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    return f"has no readable {MANIFEST} ({type(e).__name__}: {e})"
  names = sorted(recorded)[index::count]
  # Files the manifest does not record (orbax's commit markers) are not read by a restore.
  for name in names:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      return f"is missing {name}, one of the files it was saved with"
    if sha256_file(path) != recorded[name]:
      return f"failed its checksum: {name} differs from what was saved"
  return None


class CheckpointsChanged(RuntimeError):
  """A read-only Checkpointer's checkpoint changed while it was read: readers start again."""


class Checkpointer:
  """The newest `keep` checkpoints of a run under `directory`, saved asynchronously.

  A checkpoint whose files fail verification is corrupt: it is moved aside and an older one
  used. A checkpoint that verifies but does not fit what restores it (another model, another
  program) is an error (RunError); nothing is moved. A save that cannot be written (a full
  disk) is an error naming the cause; the checkpoints before it stay as they were, and the
  next start removes what it left half-written. `read_only` is for the readers of a run that
  may be live (export, predict, load_encoder): they write, move and delete nothing, neither a
  checkpoint that fails (skipped where it is) nor the directory of a save in flight.
  """

  def __init__(self, directory: str, keep: int | None = None, read_only: bool = False):
    self.directory = os.path.abspath(directory)
    self.quarantine = self.directory + "_corrupt"
    self.read_only = read_only
    self._saving = None  # the step whose save is in flight, for the manifest callback
    if read_only:  # a reader of a run that may be live: orbax creates, cleans and deletes nothing
      # (orbax's own read_only option does the same, with a warning in the log for each reader)
      options = ocp.CheckpointManagerOptions(create=False, cleanup_tmp_directories=False,
                                             max_to_keep=None, enable_async_checkpointing=False)
    else:
      options = ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=True, enable_async_checkpointing=True,
          cleanup_tmp_directories=True,  # what a save cut short left behind
          async_options=ocp.AsyncOptions(post_finalization_callback=self._record_digests))
    # PyTree handlers: they read a part of a saved tree (partial_restore), as loading the
    # encoder alone does.
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    _quiet_event_loop_errors()

  def _record_digests(self) -> None:
    """Runs in orbax's commit thread on the primary process, after every file is written and
    before the checkpoint is renamed into place."""
    step = self._saving
    candidates = glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*"))
    if not candidates and os.path.isdir(os.path.join(self.directory, str(step))):
      candidates = [os.path.join(self.directory, str(step))]  # file systems without renames
    if len(candidates) != 1:
      raise RuntimeError(f"cannot find the directory of the checkpoint being saved at step "
                         f"{step} under {self.directory}: {candidates}")
    write_manifest(candidates[0])

  def save(self, step: int, state, data_iterator, record: dict) -> None:
    """Starts saving; returns once the state is copied off the devices. `record` (JSON) goes
    into the checkpoint's meta beside the step and the data position."""
    if self.read_only:
      raise RuntimeError(f"a read-only Checkpointer of {self.directory} cannot save")
    self.wait()  # the previous save's manifest callback has run
    self._saving = step
    meta = {"step": step, **record, "data": data_iterator.get_state()}
    args = ocp.args.Composite(state=ocp.args.PyTreeSave(state), meta=ocp.args.JsonSave(meta))
    with self._writing(step):
      self.manager.save(step, args=args, force=True)

  def wait(self) -> None:
    """Blocks until every asynchronous save is on disk, its manifest included."""
    with self._writing(self._saving):
      self.manager.wait_until_finished()

  @contextlib.contextmanager
  def _writing(self, step):
    """Turns a save that the file system refused into one RunError naming the cause."""
    try:
      yield
    except Exception as e:  # noqa: BLE001 - orbax wraps the OSError in its own errors
      cause = _write_failure(e)
      if cause is None:
        raise
      kept = [s for s in self.steps() if s != step]
      newest = f"the newest complete checkpoint, step {kept[-1]}, is kept" if kept else (
          "no checkpoint was written before it")
      raise RunError(f"checkpoint at step {step}: cannot write under {self.directory}: "
                     f"{cause}; {newest}", exit_code=1) from None

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def changed(self) -> bool:
    """Whether the checkpoints on disk are other than when this Checkpointer was made (a live
    run saved one, and deleted an older one as it keeps its newest few)."""
    return sorted(int(n) for n in os.listdir(self.directory) if n.isdigit()) != self.steps()

  def read_meta(self, step: int) -> dict:
    """The JSON record of the checkpoint at `step`: {'step', 'config', 'data', ...}."""
    args = ocp.args.Composite(meta=ocp.args.JsonRestore())
    return self.manager.restore(step, args=args)["meta"]

  def newest(self) -> tuple[int, dict] | None:
    """(step, meta) of the newest checkpoint that verifies, or None. Checkpoints that fail
    are reported, and moved aside unless `read_only`. Every process must call it (the verdict on
    each checkpoint is agreed collectively)."""
    for step in reversed(self.steps()):
      if not os.path.isdir(os.path.join(self.directory, str(step))):
        continue  # deleted since the list was read: a live run's rotation, seen by a reader
      problem = verify_share(os.path.join(self.directory, str(step)), jax.process_index(),
                             jax.process_count())
      if problem is None:
        try:
          return step, self.read_meta(step)
        except Exception as e:  # noqa: BLE001 - verified files that orbax cannot read
          problem = f"has an unreadable record ({type(e).__name__}: {e})"
      problems = _gather_problems(problem)
      if problems and self.read_only and self.changed():
        raise CheckpointsChanged(f"checkpoint at step {step} {problems[0]}, under a live run")
      if problems:
        self._skip(step, problems[0])
    return None

  def restore(self, step: int, target, data_iterator=None):
    """The state of the (verified) checkpoint at `step`, in the shapes, dtypes and shardings
    of `target`, which may be a part of the saved tree (the encoder's parameters, say): only
    that part is read. With `data_iterator`, its position is restored too. A checkpoint that
    does not fit `target` is a RunError."""
    restore = ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)
    try:
      state = self.manager.restore(step, args=ocp.args.Composite(state=restore))["state"]
    except (ValueError, KeyError, TypeError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise RunError(f"checkpoint at step {step} under {self.directory}: does not fit this "
                     f"run's state ({first}); it was written by another model or program",
                     ) from None
    if data_iterator is not None:  # verified files: a position it cannot take is an error
      data_iterator.set_state(self.read_meta(step)["data"])
    return state

  def restore_newest(self, target, data_iterator=None):
    """(state, meta) of the newest checkpoint that verifies, or None if none does. `target`
    is as in `restore`, or a function of the checkpoint's meta that returns it."""
    newest = self.newest()
    if newest is None:
      return None
    step, meta = newest
    return self.restore(step, target(meta) if callable(target) else target, data_iterator), meta

  def _skip(self, step: int, why: str) -> None:
    where = "left it in place"
    if not self.read_only:
      target = os.path.join(self.quarantine, str(step))
      if jax.process_index() == 0:
        os.makedirs(self.quarantine, exist_ok=True)
        suffix = 1
        while os.path.exists(target):
          target = os.path.join(self.quarantine, f"{step}.{suffix}")
          suffix += 1
        shutil.move(os.path.join(self.directory, str(step)), target)
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"checkpoint {step} moved aside")
      self.manager.reload()
      where = f"moved it to {self.quarantine} (kept, not deleted)"
    warnings.warn(f"checkpoint at step {step} {why}; skipped it and {where}; trying the next "
                  f"older checkpoint", stacklevel=3)

  def close(self) -> None:
    self.manager.close()


# What a refused write says (os.strerror), in orbax's and tensorstore's wrapped errors too.
_WRITE_ERRORS = tuple(os.strerror(code) for code in (
    errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EIO))


def _quiet_event_loop_errors() -> None:
  """When a save fails, tensorstore's writes still in flight complete into the event loop
  orbax has closed, each reporting 'Event loop is closed' with a traceback, in whatever
  thread: noise beside the one line that reports the failure (`Checkpointer._writing`)."""
  previous = sys.unraisablehook
  if getattr(previous, "quiets_event_loop_errors", False):
    return

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  hook.quiets_event_loop_errors = True
  sys.unraisablehook = hook


def _write_failure(error: BaseException) -> str | None:
  """The file system's reason in `error` or the errors it came from, or None if it is not a
  refused write."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.strerror in _WRITE_ERRORS:
      return error.strerror
    for reason in _WRITE_ERRORS:
      if reason in str(error):
        return reason
    error = error.__cause__ or error.__context__
  return None


def _gather_problems(problem: str | None) -> list[str]:
  """Every process's verdict on its share, so that all of them skip a checkpoint together."""
  if jax.process_count() == 1:
    return [problem] if problem else []
  failed = multihost_utils.process_allgather(np.int32(problem is not None))
  if not failed.any():
    return []
  return [problem or f"failed verification in process {int(np.argmax(failed))}"]
