"""Serving copies of published adapters (core/backend/serving_copies.py): in RAM where
there is room, beside the run where there is not or the RAM write fails, dropped only
when they are copies, and none left behind by a process that died."""

import os
import subprocess
import sys

from rlcoach.backend.serving_copies import PREFIX, ServingCopies


def _save(folder):
    (folder / "adapter_model.safetensors").write_bytes(b"x" * 1000)


def test_a_copy_goes_to_ram_when_it_has_room_and_beside_the_run_when_not(tmp_path):
    ram, run = tmp_path / "shm", tmp_path / "run"
    ram.mkdir()
    copies = ServingCopies(ram)
    small = copies.write("m@1", _save, run, size_hint=1000)
    assert small.is_relative_to(ram) and (small / "adapter_model.safetensors").is_file()
    huge = copies.write("m@2", _save, run, size_hint=1 << 60)  # more than any disk has
    assert huge.is_relative_to(run)
    copies.drop(tmp_path)  # not a copy: left alone
    assert tmp_path.is_dir()
    copies.drop(small)
    assert not small.exists() and huge.exists()
    copies.close()
    assert not huge.exists() and not list(ram.iterdir()) and not list(run.iterdir())


def test_a_failed_ram_write_falls_back_beside_the_run(tmp_path):
    ram, run = tmp_path / "shm", tmp_path / "run"
    ram.mkdir()
    calls = []

    def save(folder):
        calls.append(folder)
        if folder.is_relative_to(ram):
            raise OSError(28, "No space left on device")
        _save(folder)

    copies = ServingCopies(ram)
    folder = copies.write("m@1", save, run, size_hint=0)
    assert folder.is_relative_to(run) and len(calls) == 2
    assert not calls[0].exists()  # the failed RAM folder was removed
    copies.close()


def test_copies_of_a_process_that_died_are_removed_at_the_next_start(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = tmp_path / f"{PREFIX}{dead.stdout.strip()}-abc"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-def"
    orphan.mkdir()
    mine.mkdir()
    ServingCopies(tmp_path)
    assert not orphan.exists() and mine.exists()
