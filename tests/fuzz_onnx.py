"""Fuzzing graphfix's commands on mutated real exports (issue 23, item 5).

A case is a `Plan`: one seed model (real exports with random weights, committed small under
tests/data/fuzz_seeds/), one to three `Mutation`s of it (protobuf fields, shapes, dtypes,
attributes, truncated bytes, dangling names, cycles, huge dims, external-data paths), and a command
chain run through the CLI in-process (`graphfix.cli.main.main`): load → inspect → fix (the plan's
strategy) → precision → qdq inspect → validate/locate.  Hypothesis draws the plans.

A case passes when every command ends in success or in graphfix's one-line error with a documented
exit code (DESIGN.md: 1 check failed, 2 input/options, 3 environment) and no traceback on stderr.
Anything else escaping a command is a *traceback* finding; a case running past its time limit is a
*hang* (a faulthandler watchdog ends the worker process, and the campaign records the case); a case
whose worker dies another way (an abort inside a native library) is a *crash*.

    python tests/fuzz_onnx.py --cases 20000            # the campaign, chunks in worker processes
    python tests/fuzz_onnx.py --replay '{"seed": …}'   # one case, its output shown
    python tests/fuzz_onnx.py --make-seeds             # rebuild the seed corpus (needs torch)

The smoke run in CI is tests/test_fuzz.py; every finding fixed becomes a regression case there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from graphfix.attention.strategies import STRATEGIES

SEED_DIR = Path(__file__).resolve().parent / "data" / "fuzz_seeds"
SEED_SUFFIX = ".onnx.seed"  # *.onnx is git-ignored; the seeds are committed under this suffix
COMMANDS = ("inspect", "fix", "precision", "qdq", "validate", "locate")
ALLOWED_EXIT = {0, 1, 2, 3}
# Values chosen where a mutation needs one: the boundaries parsers and size arithmetic get wrong.
DIMS = (0, -1, 1, 3, 2**31 - 1, 2**31, 2**40, 2**62, -(2**40))
DTYPES = (1, 10, 16, 11, 7, 6, 3, 9, 8, 0, 999)  # float, f16, bf16, double, i64, i32, i8, bool, str
INTS = (0, -1, 1, 2, -7, 99, 2**31, -(2**31), 2**62)
FLOATS = (0.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan"))
OP_TYPES = ("Softmax", "MatMul", "Add", "Relu", "Where", "Cast", "Reshape", "Bogus", "Attention")
OPSETS = (1, 7, 11, 13, 17, 23, 99, 10000)
EXTERNAL = ("missing.bin", "../outside.bin", "/etc/hostname", "data.bin", "", "sub/../data.bin")

MUTATIONS = (
    "truncate",
    "flip_bytes",
    "dim",
    "rank",
    "dtype",
    "attr_drop",
    "attr_value",
    "attr_add",
    "dangling",
    "cycle",
    "dup_output",
    "drop_node",
    "drop_init",
    "op_type",
    "opset",
    "external",
    "raw_truncate",
    "init_dims",
    "drop_outputs",
    "ir_version",
    "softmax_axis",
    "constant_value",
    "name_clash",
    "empty_graph",
    "duplicate_input",
    "values",
    "values",
    "dim",
    "softmax_axis",
)  # (listed twice: mutations that keep the model valid, so the case reaches the later commands)


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One change to the seed: `kind` from MUTATIONS; `a`, `b`, `c` pick what and how (taken
    modulo the number of candidates, so any integers make a valid plan)."""

    kind: str
    a: int = 0
    b: int = 0
    c: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: str
    mutations: tuple[Mutation, ...]
    command: str
    strategy: str = "plugin"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        data["mutations"] = tuple(Mutation(**m) for m in data["mutations"])
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # "traceback", "hang", "crash", "exit" (an undocumented exit code or a missing error
    # line); "harness" for a mutation this file failed to make (its bug, not graphfix's)
    command: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    plan: Plan
    findings: tuple[Finding, ...]
    exits: tuple[tuple[str, int], ...]

    @property
    def ok(self) -> bool:
        return not self.findings


def seeds() -> list[str]:
    return sorted(p.name[: -len(SEED_SUFFIX)] for p in SEED_DIR.glob(f"*{SEED_SUFFIX}"))


def plans():
    """The hypothesis strategy drawing plans."""
    from hypothesis import strategies as st

    index = st.integers(min_value=0, max_value=2**16)
    mutation = st.builds(Mutation, st.sampled_from(MUTATIONS), index, index, index)
    return st.builds(
        Plan,
        st.sampled_from(seeds()),
        st.lists(mutation, min_size=1, max_size=3).map(tuple),
        st.sampled_from(COMMANDS),
        st.sampled_from(sorted(STRATEGIES)),
    )


# --------------------------------------------------------------------------------------------
# Mutations


def _pick(seq, k: int):
    return seq[k % len(seq)] if len(seq) else None


def _value_infos(g) -> list:
    return [*g.input, *g.output, *g.value_info]


def apply_mutation(model, m: Mutation, folder: Path) -> bytes | None:
    """Apply `m` to `model` in place; returns raw bytes instead for byte-level mutations."""
    import onnx
    from onnx import helper

    g = model.graph
    kind = m.kind
    if kind in ("truncate", "flip_bytes"):
        data = bytearray(model.SerializeToString())
        if kind == "truncate" or not data:  # (an earlier truncation may have left nothing)
            return bytes(data[: m.a % max(len(data), 1)])
        for j in range(1 + m.c % 4):
            position = (m.a + j * 7919 * (m.b + 1)) % len(data)
            data[position] ^= 1 << (m.b + j) % 8
        return bytes(data)
    if kind == "dim":
        value = _pick(_value_infos(g), m.a)
        dims = value.type.tensor_type.shape.dim if value is not None else []
        if len(dims):
            dim = dims[m.b % len(dims)]
            choice = m.c % (len(DIMS) + 2)
            if choice < len(DIMS):
                dim.dim_value = DIMS[choice]
            elif choice == len(DIMS):
                dim.dim_param = "N"
            else:
                dim.Clear()
    elif kind == "rank":
        value = _pick(_value_infos(g), m.a)
        if value is not None:
            shape = value.type.tensor_type.shape
            if m.b % 2 and len(shape.dim):
                del shape.dim[-1]
            else:
                shape.dim.add().dim_value = 1 + m.c % 4
    elif kind == "dtype":
        targets = [*_value_infos(g), *g.initializer]
        target = _pick(targets, m.a)
        dtype = DTYPES[m.b % len(DTYPES)]
        if isinstance(target, onnx.TensorProto):
            target.data_type = dtype
        elif target is not None:
            target.type.tensor_type.elem_type = dtype
    elif kind in ("attr_drop", "attr_value", "attr_add", "softmax_axis"):
        nodes = [n for n in g.node if kind != "softmax_axis" or n.op_type == "Softmax"]
        node = _pick(nodes, m.a)
        if node is None:
            return None
        if kind == "attr_add":
            node.attribute.append(helper.make_attribute("bogus", INTS[m.b % len(INTS)]))
        elif kind == "softmax_axis":
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("axis", m.b % 21 - 10))
        elif len(node.attribute):
            attr = node.attribute[m.b % len(node.attribute)]
            if kind == "attr_drop":
                node.attribute.remove(attr)
            else:
                _corrupt_attribute(attr, m.c)
    elif kind in ("dangling", "cycle", "dup_output"):
        if not len(g.node):
            return None
        k = m.a % len(g.node)
        node = g.node[k]
        if kind == "dup_output":
            other = g.node[m.b % len(g.node)]
            if len(node.output) and len(other.output):
                node.output[0] = other.output[m.c % len(other.output)]
        elif len(node.input):
            slot = m.b % len(node.input)
            if kind == "dangling":
                node.input[slot] = f"dangling_{m.c}"
            else:  # the output of this node or of a later one: a cycle
                later = g.node[k + m.c % (len(g.node) - k)]
                if len(later.output):
                    node.input[slot] = later.output[0]
    elif kind == "drop_node":
        if len(g.node):
            del g.node[m.a % len(g.node)]
    elif kind == "drop_init":
        if len(g.initializer):
            del g.initializer[m.a % len(g.initializer)]
    elif kind == "op_type":
        node = _pick(g.node, m.a)
        if node is not None:
            if m.c % 4 == 0:
                node.domain = "com.bogus"
            else:
                node.op_type = OP_TYPES[m.b % len(OP_TYPES)]
    elif kind == "opset":
        if m.b % 5 == 0:
            del model.opset_import[:]
        else:
            for opset in model.opset_import:
                if opset.domain in ("", "ai.onnx"):
                    opset.version = OPSETS[m.a % len(OPSETS)]
    elif kind == "external":
        _externalise(model, m, folder)
    elif kind == "raw_truncate":
        init = _pick(g.initializer, m.a)
        if init is not None and init.raw_data:
            init.raw_data = init.raw_data[: m.b % len(init.raw_data)]
    elif kind == "init_dims":
        init = _pick(g.initializer, m.a)
        if init is not None:
            if len(init.dims) and m.c % 2:
                init.dims[m.b % len(init.dims)] = DIMS[m.c % len(DIMS)]
            else:
                init.dims.append(DIMS[m.b % len(DIMS)])
    elif kind == "drop_outputs":
        if m.b % 2:
            del g.output[:]
        elif len(g.output):
            del g.output[m.a % len(g.output)]
    elif kind == "ir_version":
        model.ir_version = (0, 1, 3, 7, 10, 11, 99)[m.a % 7]
    elif kind == "constant_value":
        node = _pick([n for n in g.node if n.op_type == "Constant"], m.a)
        if node is not None and len(node.attribute):
            tensor = node.attribute[0].t
            if m.b % 2:
                tensor.data_type = DTYPES[m.c % len(DTYPES)]
            else:
                tensor.raw_data = tensor.raw_data[: m.c % (len(tensor.raw_data) + 1)]
    elif kind == "name_clash":
        init = _pick(g.initializer, m.a)
        value = _pick([*g.input, *g.output], m.b)
        if init is not None and value is not None:
            old = init.name
            init.name = value.name
            for node in g.node:
                node.input[:] = [value.name if i == old else i for i in node.input]
    elif kind == "values":  # extreme but well-formed weights: NaN, inf, 1e30, zeros
        init = _pick(
            [
                t
                for t in g.initializer
                if t.data_type in (1, 10, 16, 11, 7, 6) and t.data_location != t.EXTERNAL
            ],
            m.a,
        )
        if init is not None:
            from onnx import numpy_helper

            try:
                array = numpy_helper.to_array(init).copy()
            except ValueError:  # an earlier mutation cut its bytes short: leave it so
                return None
            if array.size:
                fill = FLOATS[m.b % len(FLOATS)] if array.dtype.kind == "f" else INTS[m.b % 5]
                array.reshape(-1)[m.c % array.size :: 1 + m.c % 3] = fill
                init.CopyFrom(numpy_helper.from_array(array, init.name))
    elif kind == "empty_graph":
        del g.node[:]
    elif kind == "duplicate_input":
        value = _pick(g.input, m.a)
        if value is not None:
            g.input.append(value)
    return None


def _corrupt_attribute(attr, c: int) -> None:
    from onnx import AttributeProto

    choice = c % 5
    if attr.type == AttributeProto.INT:
        attr.i = INTS[c % len(INTS)]
    elif attr.type == AttributeProto.FLOAT:
        attr.f = FLOATS[c % len(FLOATS)]
    elif attr.type == AttributeProto.INTS:
        del attr.ints[:]
        attr.ints.extend(INTS[: c % 4])
    elif attr.type == AttributeProto.STRING:
        attr.s = (b"", b"\xff\xfe", b"bogus")[c % 3]
    elif attr.type == AttributeProto.TENSOR:
        attr.t.data_type = DTYPES[c % len(DTYPES)]
    if choice == 4:  # the declared type no longer matches the field that holds the value
        attr.type = (AttributeProto.FLOAT, AttributeProto.INTS, AttributeProto.GRAPH)[c % 3]


def _externalise(model, m: Mutation, folder: Path) -> None:
    """Move an initializer's bytes to an external file, then break the reference one way."""
    from onnx import TensorProto

    init = _pick([t for t in model.graph.initializer if t.raw_data], m.a)
    if init is None:
        return
    location = EXTERNAL[m.b % len(EXTERNAL)]
    data = bytes(init.raw_data)
    if location in ("data.bin", "sub/../data.bin"):
        (folder / "sub").mkdir(exist_ok=True)
        (folder / "data.bin").write_bytes(data[: len(data) - m.c % 3 * (len(data) // 2)])
    init.ClearField("raw_data")
    init.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(m.c % 2 * 2**40), "length": str(len(data))}
    if m.c % 7 == 3:
        entries["length"] = "-5"
    for key, value in entries.items():
        init.external_data.add(key=key, value=value)


# --------------------------------------------------------------------------------------------
# Running a case


def write_case(plan: Plan, folder: Path) -> Path:
    """The seed with the plan's mutations applied, as `folder/model.onnx`."""
    import onnx

    raw = (SEED_DIR / f"{plan.seed}{SEED_SUFFIX}").read_bytes()
    model = onnx.ModelProto()
    model.ParseFromString(raw)
    path = folder / "model.onnx"
    for mutation in plan.mutations:
        try:
            data = apply_mutation(model, mutation, folder)
        except UnicodeDecodeError:  # flipped bytes broke a name: the file keeps those bytes
            return path
        if data is not None:  # byte-level: the rest of the plan applies to what still parses
            path.write_bytes(data)
            try:
                model = onnx.ModelProto()
                model.ParseFromString(data)
            except Exception:  # unparseable bytes are the point of the case
                return path
    path.write_bytes(model.SerializeToString())
    return path


def command_lines(plan: Plan, folder: Path) -> list[list[str]]:
    """Every case runs the whole chain on what loads: inspect → fix (the plan's strategy) →
    precision → qdq inspect → validate; `locate` plans also localise the precision output."""
    model = str(folder / "model.onnx")
    fixed = str(folder / "fixed.onnx")
    low = str(folder / "low.onnx")
    to = "bfloat16" if plan.mutations[0].c % 3 == 0 else "float16"
    chain = [
        ["inspect", model],
        ["inspect", model, "--json"],
        ["fix", model, "-o", fixed, "--strategy", plan.strategy, "--always-write", "--json"],
        ["inspect", fixed],
        ["precision", model, "-o", low, "--to", to],
        ["qdq", "inspect", model, "--json"],
        ["validate", model, fixed, "--no-histogram", "--backend", "onnxruntime"],
    ]
    if plan.command == "locate":
        chain.append(["locate", model, low, "--no-remedies"])
    return chain


def run_command(argv: list[str]) -> tuple[int, str, Finding | None]:
    """One CLI command in-process: its exit code, stderr, and a finding if it misbehaved."""
    from graphfix.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    finding = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: its own one-line error, exit 2
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # anything else escaping is the finding
            if isinstance(exc, KeyboardInterrupt):
                raise
            code = -1
            finding = Finding("traceback", " ".join(argv[:1]), traceback.format_exc())
    stderr = err.getvalue()
    if finding is None and "Traceback (most recent call last)" in stderr:
        finding = Finding("traceback", argv[0], stderr)
    if finding is None and code not in ALLOWED_EXIT:
        finding = Finding("exit", argv[0], f"exit code {code}: {stderr[-2000:]}")
    if finding is None and code in (2, 3) and "error" not in stderr:
        finding = Finding("exit", argv[0], f"exit {code} without an error line: {stderr[-2000:]}")
    return code, stderr, finding


def run_case(plan: Plan, *, keep: Path | None = None) -> Outcome:
    """Run `plan` in a fresh folder (removed afterwards unless `keep`)."""
    folder = Path(tempfile.mkdtemp(prefix="graphfix-fuzz-")) if keep is None else keep
    findings: list[Finding] = []
    exits: list[tuple[str, int]] = []
    cwd = os.getcwd()
    try:
        os.chdir(folder)  # anything a command writes by default lands in the case's folder
        try:
            write_case(plan, folder)
        except Exception:  # a bug of this harness, not of graphfix: reported apart
            return Outcome(plan, (Finding("harness", "mutate", traceback.format_exc()),), ())
        for argv in command_lines(plan, folder):
            reads = [a for i, a in enumerate(argv) if a.endswith(".onnx") and argv[i - 1] != "-o"]
            if not all(Path(a).exists() for a in reads):
                continue  # its input was not written (fix or precision refused the model)
            code, _, finding = run_command(argv)
            exits.append((argv[0], code))
            if finding is not None:
                findings.append(finding)
                break
            if code != 0 and argv[0] == "inspect":
                break  # the model does not load: later commands would say the same
    finally:
        os.chdir(cwd)
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    return Outcome(plan, tuple(findings), tuple(exits))


# --------------------------------------------------------------------------------------------
# The campaign: chunks of cases in worker processes, each case under a watchdog


def _worker(cases: int, seed: int, log: Path, limit: float) -> None:
    """Run `cases` hypothesis-drawn plans, logging a `start` line before and an `end` line
    after each; a case past `limit` seconds ends this process (the parent records a hang)."""
    import faulthandler
    import resource

    import cache_dirs
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(cache_dirs.root() / "hypothesis")  # not ./.hypothesis in the checkout

    # A case that asks for gigabytes fails here with MemoryError (a finding) instead of
    # swapping the machine: graphfix must refuse absurd sizes before allocating.
    gib = 2**30
    resource.setrlimit(resource.RLIMIT_AS, (8 * gib, 8 * gib))
    with log.open("a") as stream:

        @hypothesis_seed(seed)
        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(plans())
        def campaign(plan: Plan) -> None:
            stream.write(json.dumps({"start": plan.to_json()}) + "\n")
            stream.flush()
            faulthandler.dump_traceback_later(limit, exit=True, file=sys.stderr)
            started = time.monotonic()
            try:
                outcome = run_case(plan)
            finally:
                faulthandler.cancel_dump_traceback_later()
            record = {
                "end": plan.to_json(),
                "seconds": round(time.monotonic() - started, 3),
                "exits": outcome.exits,
                "findings": [dataclasses.asdict(f) for f in outcome.findings],
            }
            stream.write(json.dumps(record) + "\n")
            stream.flush()

        campaign()


def summarise(log: Path) -> dict:
    """Cases, tracebacks, hangs and crashes recorded in a campaign log: a case that started and
    never ended is a hang if the watchdog ended its worker, a crash if the worker died another way
    (an abort inside a native library, a signal), as the parent's `died` record says."""
    started: dict[str, int] = {}
    ended = 0
    findings: list[dict] = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "start" in record:
            started[record["start"]] = started.get(record["start"], 0) + 1
        elif "died" in record:
            ended += 1
            started[record["died"]] -= 1
            kind = "hang" if _WATCHDOG in record["detail"] else "crash"
            findings.append({"plan": record["died"], "kind": kind, "command": "?", **record})
        else:
            ended += 1
            started[record["end"]] -= 1
            for finding in record["findings"]:
                findings.append({"plan": record["end"], **finding})
    hangs = [plan for plan, open_ in started.items() if open_ > 0]
    for plan in hangs:
        findings.append({"plan": plan, "kind": "hang", "command": "?", "detail": ""})
    return {"cases": ended + len(hangs), "findings": findings}


# What faulthandler's watchdog prints before it ends a worker.
_WATCHDOG = "Timeout ("


def _record_death(log: Path, returncode: int, stderr: str) -> None:
    """The worker ended without finishing its case: record the open case with how it died."""
    open_: dict[str, int] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        plan = record.get("start") or record.get("end") or record["died"]
        open_[plan] = open_.get(plan, 0) + (1 if "start" in record else -1)
    with log.open("a") as stream:
        for plan, count in open_.items():
            for _ in range(count):
                record = {"died": plan, "returncode": returncode, "detail": stderr[-4000:]}
                stream.write(json.dumps(record) + "\n")


def campaign(cases: int, *, chunk: int, seed: int, log: Path, limit: float) -> dict:
    done = 0
    round_ = 0
    while done < cases:
        size = min(chunk, cases - done)
        before = summarise(log)["cases"] if log.exists() else 0
        worker = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                str(size),
                "--seed",
                str(seed * 100_003 + round_),
                "--log",
                str(log),
                "--limit",
                str(limit),
            ],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        if worker.returncode != 0:
            _record_death(log, worker.returncode, worker.stderr)
        after = summarise(log)["cases"]
        done += max(after - before, 1)
        round_ += 1
        print(f"{time.strftime('%H:%M:%S')} {after} cases", file=sys.stderr, flush=True)
    return summarise(log)


# --------------------------------------------------------------------------------------------
# Seeds


SEED_ENTRIES = (
    "sdpa_mask-dynamo18",
    "sdpa_causal_dynamic-legacy17",
    "eager_einsum-legacy17",
    "sdpa_fp16-legacy17",
    "eager_bf16-legacy17",
    "sdpa_cross-legacy17",
    "moe_router-legacy17",
    "sdpa_mask-dynamo23",
)


def make_seeds() -> None:
    """Write the seed corpus: small corpus exports, the demo model, a quantized export."""
    import model_corpus
    import onnx

    import graphfix.examples

    SEED_DIR.mkdir(parents=True, exist_ok=True)
    by_name = {e.name: e for e in model_corpus.CORPUS}
    for name in SEED_ENTRIES:
        data = model_corpus.model_path(by_name[name]).read_bytes()
        (SEED_DIR / f"{name}{SEED_SUFFIX}").write_bytes(data)
    demo = graphfix.examples.vit_example(blocks=1, width=32, heads=2)
    (SEED_DIR / f"vit_demo{SEED_SUFFIX}").write_bytes(demo.SerializeToString())
    import matcher_corpus

    quantized = onnx.load(str(matcher_corpus.quantized_path("sdpa_mask-dynamo18")))
    (SEED_DIR / f"sdpa_mask-ort_qdq{SEED_SUFFIX}").write_bytes(quantized.SerializeToString())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=500, help="cases per worker process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds before a case hangs")
    parser.add_argument("--log", type=Path, default=Path("fuzz-campaign.jsonl"))
    parser.add_argument("--replay", help="run one plan (its JSON) and print what it did")
    parser.add_argument("--summary", action="store_true", help="summarise --log and exit")
    parser.add_argument("--make-seeds", action="store_true")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make_seeds:
        make_seeds()
        return 0
    if args.worker is not None:
        _worker(args.worker, args.seed, args.log, args.limit)
        return 0
    if args.replay:
        outcome = run_case(Plan.from_json(args.replay))
        print(json.dumps(dataclasses.asdict(outcome), indent=2, default=str))
        return 0 if outcome.ok else 1
    started = time.monotonic()
    if not args.summary:
        campaign(args.cases, chunk=args.chunk, seed=args.seed, log=args.log, limit=args.limit)
    result = summarise(args.log)
    kinds: dict[str, int] = {}
    for finding in result["findings"]:
        kinds[finding["kind"]] = kinds.get(finding["kind"], 0) + 1
    print(
        f"{result['cases']} cases, {len(result['findings'])} finding(s) {kinds or ''}, "
        f"{time.monotonic() - started:.0f} s (log {args.log})"
    )
    for finding in result["findings"][:20]:
        print(f"- {finding['kind']} in {finding['command']}: {finding['plan']}")
        print("  " + finding["detail"].strip().splitlines()[-1] if finding["detail"] else "")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
