"""`rlcoach mcp train` with its defaults on third-party MCP servers, several seeds each:
held-out success before training, after the SFT warm-up and at the end, with a 95%
interval, the share of two-call tasks and the wall time per run.

Each server is installed, pinned, in its own environment under `--servers-dir` (PyPI
packages in a venv each; `--install` makes them), and runs unmodified over stdio on data
made here for the run: the bookshop of `examples/mcp_servers/shop.sql` (a SQLite file, for
the two database servers), a small git repository (eight commits by three people, two
branches, an untracked file) and a workbook of two sheets. Runs go one after another (two
at once on a 2-core CPU slow each other several-fold).

    python bench/mcp_servers.py --install --servers-dir ~/mcpservers
    python bench/mcp_servers.py --servers-dir ~/mcpservers --seeds 0 1 2 --root runs/servers
    python bench/mcp_servers.py --servers-dir ~/mcpservers --only git --seeds 0
    python bench/mcp_servers.py --table runs/servers   # the table of finished runs only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVERS = {
    "sqlite": {
        "kind": "database (SQLite, answers Python literals), two-step questions",
        "package": "mcp==1.30.0 mcp-server-sqlite==2025.4.25",
        "command": "{env}/bin/mcp-server-sqlite --db-path {data}/shop.db",
    },
    "alchemy": {
        "kind": "database (SQLAlchemy, one tool runs any SQL: read-only guard)",
        "package": "mcp-alchemy==2026.10.15.202659",
        "command": "{env}/bin/mcp-alchemy",
        "env": {"DB_URL": "sqlite:///{data}/shop.db"},
    },
    "git": {
        "kind": "repository (git; text answers)",
        "package": "mcp-server-git==2026.10.19",
        "command": "{env}/bin/mcp-server-git --repository {data}/repo",
    },
    "excel": {
        "kind": "files (Excel workbooks; 46 tools, 9 read-only)",
        "package": "excel-mcp-server==2.2.2",
        "command": "{env}/bin/excel-mcp-server stdio",
        "env": {"EXCEL_FILES_PATH": "{data}/sheets"},
    },
}

COMMITS = [
    (
        "Ada Lovelace",
        "notes/engine.md",
        "The engine computes Bernoulli numbers.\n",
        "Describe the engine",
    ),
    ("Grace Hopper", "notes/compiler.md", "The A-0 compiler ran in 1952.\n", "Add compiler notes"),
    ("Alan Turing", "notes/machine.md", "A machine with an infinite tape.\n", "Sketch the machine"),
    (
        "Ada Lovelace",
        "notes/engine.md",
        "It weaves algebraic patterns.\n",
        "Extend the engine notes",
    ),
    ("Grace Hopper", "todo.md", "- find the moth in relay 70\n", "Start a todo list"),
    ("Alan Turing", "notes/machine.md", "Halting is undecidable.\n", "Note the halting problem"),
    ("Grace Hopper", "todo.md", "- order 12 spare relays\n", "Order spare relays"),
]
RELEASE = ("Ada Lovelace", "VERSION", "1.0.0\n", "Tag version 1.0.0")


def make_data(name: str, folder: Path, servers_dir: Path) -> None:
    """The data one server serves, made fresh in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if name in ("sqlite", "alchemy"):
        with sqlite3.connect(folder / "shop.db") as db:
            db.executescript((ROOT / "examples" / "mcp_servers" / "shop.sql").read_text())
    elif name == "git":
        make_repo(folder / "repo")
    elif name == "excel":
        (folder / "sheets").mkdir(exist_ok=True)
        python = servers_dir / "excel" / "bin" / "python"  # its environment has openpyxl
        subprocess.run(
            [str(python), "-c", _WORKBOOK, str(folder / "sheets" / "sales.xlsx")], check=True
        )


_WORKBOOK = """
import sys, openpyxl
book = openpyxl.Workbook()
sales = book.active
sales.title = "Sales"
for row in [("Region", "Rep", "Product", "Units", "Revenue"), ("North", "Ines", "Kettle", 12, 480),
            ("South", "Omar", "Toaster", 7, 315), ("East", "Lena", "Kettle", 20, 800),
            ("West", "Pavel", "Blender", 5, 450), ("North", "Ines", "Blender", 3, 270)]:
    sales.append(row)
staff = book.create_sheet("Staff")
for row in [("Name", "Office", "Started"), ("Ines", "Leeds", "2021-03-01"),
            ("Omar", "Cairo", "2019-11-15"), ("Lena", "Graz", "2023-06-20"),
            ("Pavel", "Brno", "2020-01-07")]:
    staff.append(row)
book.save(sys.argv[1])
"""


def make_repo(repo: Path) -> None:
    """A small git repository: eight commits by three people on `main` and `release`,
    fixed dates, and an untracked file."""
    repo.mkdir()

    def git(*args: str, who: str = "Ada Lovelace", day: int = 1) -> None:
        email = who.split()[0].lower() + "@example.org"
        stamp = f"2026-11-{day:02d}T10:00:00+00:00"
        env = {**os.environ, "GIT_AUTHOR_NAME": who, "GIT_AUTHOR_EMAIL": email,
               "GIT_COMMITTER_NAME": who, "GIT_COMMITTER_EMAIL": email,
               "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}  # fmt: skip
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    for day, (who, path, text, message) in enumerate(COMMITS, start=1):
        file = repo / path
        file.parent.mkdir(parents=True, exist_ok=True)
        with file.open("a") as out:
            out.write(text)
        git("add", path, who=who, day=day)
        git("commit", "-q", "-m", message, who=who, day=day)
        if day == 4:
            git("branch", "release", who=who, day=day)
    git("checkout", "-q", "release")
    who, path, text, message = RELEASE
    (repo / path).write_text(text)
    git("add", path, who=who, day=9)
    git("commit", "-q", "-m", message, who=who, day=9)
    git("checkout", "-q", "main")
    (repo / "draft.md").write_text("An idea about relays.\n")  # untracked


def install(servers_dir: Path, names: list[str]) -> None:
    for name in names:
        spec = SERVERS[name]
        env = servers_dir / name
        if not (env / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(env / "bin" / "pip"), "install", "-q", *spec["package"].split()]
        subprocess.run(pip, check=True)


def run_one(name: str, seed: int, root: Path, servers_dir: Path) -> Path:
    """One `rlcoach mcp train` run with its defaults; returns the run's folder."""
    spec = SERVERS[name]
    folder = root / f"{name}-s{seed}"
    if (folder / "report.json").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    data = folder / "data"
    make_data(name, data, servers_dir)
    fill = {"env": str(servers_dir / name), "data": str(data)}
    command = [
        str(ROOT / ".venv" / "bin" / "rlcoach"), "mcp", "train",
        "--server", spec["command"].format(**fill),
        "--seed", str(seed), "--root", str(folder / "run"), "--name", name,
    ]  # fmt: skip
    for key, value in spec.get("env", {}).items():
        command += ["--env", f"{key}={value.format(**fill)}"]
    started = time.monotonic()
    with (folder / "log.txt").open("w") as log:
        print(f"[{name} seed {seed}] {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    minutes = (time.monotonic() - started) / 60
    reports = list((folder / "run").rglob("report.json"))
    if done.returncode != 0 or not reports:
        print(f"[{name} seed {seed}] failed (exit {done.returncode}): see {folder / 'log.txt'}")
        return folder
    report = json.loads(reports[0].read_text())
    report["bench_minutes"] = minutes
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    print(f"[{name} seed {seed}] {_row_of(report)} in {minutes:.1f} min", flush=True)
    return folder


def _row_of(report: dict) -> str:
    warm = (report.get("warmup") or {}).get("eval") or {}
    return (
        f"held-out success {report['eval_before']['success']:.3f} -> SFT "
        f"{warm.get('success', float('nan')):.3f} -> final {report['eval_after']['success']:.3f}"
    )


def wilson(successes: float, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a rate."""
    if n == 0:
        return (math.nan, math.nan)
    z, p = 1.96, successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _cell(evals: list[dict]) -> str:
    """The mean over seeds, the 95% interval of the pooled rollouts, each seed's rate."""
    rates = [(e["success"], int(e["rollouts"])) for e in evals]
    n = sum(c for _, c in rates)
    low, high = wilson(sum(s * c for s, c in rates), n)
    seeds = " / ".join(f"{s:.2f}" for s, _ in rates)
    return f"**{sum(s for s, _ in rates) / len(rates):.3f}** [{low:.2f}, {high:.2f}] ({seeds})"


def table(root: Path) -> str:
    """The Markdown table of every finished run under `root`, a row per server."""
    lines = [
        "| server | seeds | scenarios train / held out (two-call) | held-out success before "
        "| after SFT | final | final - SFT | minutes / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in SERVERS:
        reports = [json.loads(p.read_text()) for p in sorted(root.glob(f"{name}-s*/report.json"))]
        if not reports:
            continue

        warm = [r for r in reports if (r.get("warmup") or {}).get("eval")]
        gap = [r["eval_after"]["success"] - r["warmup"]["eval"]["success"] for r in warm]
        scen = reports[0]["scenarios"]
        sft = _cell([r["warmup"]["eval"] for r in warm]) if len(warm) == len(reports) else "n/a"
        lines.append(
            f"| {name} ({SERVERS[name]['kind']}) | {len(reports)} | {scen['train']} / "
            f"{scen['eval']} ({scen.get('two_call', 0)}) | "
            f"{_cell([r['eval_before'] for r in reports])} | {sft} | "
            f"{_cell([r['eval_after'] for r in reports])} | "
            + (f"{100 * sum(gap) / len(gap):+.1f} pt" if gap else "n/a")
            + f" | {sum(r['bench_minutes'] for r in reports) / len(reports):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers-dir", type=Path, default=Path.home() / "mcpservers")
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "servers")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=list(SERVERS), default=list(SERVERS))
    parser.add_argument("--install", action="store_true", help="install the servers and stop")
    parser.add_argument("--table", type=Path, help="print the table of the runs under a folder")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.install:
        install(args.servers_dir, args.only)
        return
    for seed in args.seeds:  # every server once before the next seed
        for name in args.only:
            run_one(name, seed, args.root, args.servers_dir)
    print(table(args.root))


if __name__ == "__main__":
    main()
