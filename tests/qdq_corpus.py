"""Quantized diffusion models for the Q/DQ lint: real exports, quantized by real tools.

Float models: the corpus's SD-like `UNet2DConditionModel` and `AutoencoderKL` (tests/model_corpus.py),
and, exported here, an SDXL-like `UNet2DConditionModel` (text_time conditioning, 2-layer
transformers, linear projections) and a small SVD-like `UNetSpatioTemporalConditionModel` (its
temporal ResNets are Conv3d with 3×1×1 kernels).  Quantizers: onnxruntime's `quantize_static` (QDQ format, symmetric
int8 activations per tensor, int8 weights per channel — what TensorRT consumes; used in CI) and
ModelOpt's ONNX PTQ (`modelopt.onnx.quantization`, INT8 and FP8), which runs only in the separate
peers venv (/work/venvs/peers, onnxruntime-gpu) through a subprocess; benchmarks only.

Every file is cached in the corpus dir (`GRAPHFIX_CORPUS_DIR`), keyed by `RECIPE`, the library
versions and the float model's file name, so later runs only read it.

    python tests/qdq_corpus.py                  # float + ORT-quantized models, print paths
    python tests/qdq_corpus.py --modelopt       # also ModelOpt INT8/FP8 (needs the peers venv)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_corpus

PEERS_PYTHON = Path(os.environ.get("GRAPHFIX_PEERS_PYTHON", "/work/venvs/peers/bin/python"))
MODELS = ("unet", "sdxl_unet", "svd_unet", "vae")
CALIBRATION_SAMPLES = 4
SEED = 0


def _svd_unet() -> model_corpus.Exportable:
    diffusers = model_corpus._diffusers()
    torch = model_corpus._seeded()
    unet = diffusers.UNetSpatioTemporalConditionModel(
        sample_size=8,
        in_channels=8,
        out_channels=4,
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        block_out_channels=(32, 64),
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=24,
        layers_per_block=1,
        cross_attention_dim=32,
        num_attention_heads=(2, 4),
        num_frames=2,
    ).eval()

    class VideoDenoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample: Any, timestep: Any, context: Any, time_ids: Any) -> Any:
            return self.unet(
                sample,
                timestep,
                encoder_hidden_states=context,
                added_time_ids=time_ids,
                return_dict=False,
            )[0]

    args = (
        torch.randn(1, 2, 8, 8, 8),
        torch.tensor(10.0),
        torch.randn(1, 1, 32),
        torch.randn(1, 3),
    )
    return model_corpus.Exportable(
        VideoDenoiser().eval(), args, ("sample", "timestep", "context", "time_ids")
    )


# Bump when an export or quantization recipe here changes: it keys every cached file.
RECIPE = "1"


def _sdxl_unet() -> model_corpus.Exportable:
    """SDXL's layout, small: text_time added conditioning, 2 transformer layers in the inner
    block, linear projections in and out of the transformers."""
    diffusers = model_corpus._diffusers()
    torch = model_corpus._seeded()
    unet = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
        norm_num_groups=8,
        use_linear_projection=True,
    ).eval()

    class XLDenoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(
            self, sample: Any, timestep: Any, context: Any, text_embeds: Any, time_ids: Any
        ) -> Any:
            conditions = {"text_embeds": text_embeds, "time_ids": time_ids}
            return self.unet(
                sample,
                timestep,
                encoder_hidden_states=context,
                added_cond_kwargs=conditions,
                return_dict=False,
            )[0]

    args = (
        torch.randn(1, 4, 8, 8),
        torch.tensor(10.0),
        torch.randn(1, 77, 64),
        torch.randn(1, 32),
        torch.randn(1, 6),
    )
    return model_corpus.Exportable(
        XLDenoiser().eval(), args, ("sample", "timestep", "context", "text_embeds", "time_ids")
    )


_EXPORTS = {"svd_unet": _svd_unet, "sdxl_unet": _sdxl_unet}


def _key(*parts: str) -> str:
    text = "\n".join([*parts, RECIPE])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def float_path(model: str) -> Path:
    """The float32 ONNX export of `model` (one of MODELS), exported on a cache miss."""
    if model == "unet":
        return model_corpus.model_path(_corpus_entry("unet_sdpa-legacy17"))
    if model == "vae":
        return model_corpus.model_path(_corpus_entry("vae-legacy17"))
    if model not in _EXPORTS:
        raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")
    factory = _EXPORTS[model]
    directory = model_corpus.corpus_dir()
    versions = model_corpus._versions(
        model_corpus.CorpusEntry(model, factory, "legacy", 17, model_corpus.Expected(), "diffusers")
    )
    path = directory / f"qdq-{model}-legacy17-{_key(versions)}.onnx"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        try:
            model_corpus._export(factory(), partial, exporter="legacy", opset=17)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
    return path


def _corpus_entry(name: str) -> model_corpus.CorpusEntry:
    (entry,) = (e for e in model_corpus.CORPUS if e.name == name)
    return entry


def calibration_feeds(model_path: Path, *, count: int = CALIBRATION_SAMPLES) -> list[dict]:
    """Seeded random inputs for calibration and for comparing models (same for every quantizer)."""
    import numpy as np
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    rng = np.random.default_rng(SEED)
    return [model_corpus.random_feed(model, rng) for _ in range(count)]


def ort_quantized_path(model: str) -> Path:
    """`model` quantized by onnxruntime's quantize_static: QDQ, int8 symmetric, per-channel weights."""
    source = float_path(model)
    path = (
        model_corpus.corpus_dir() / f"qdq-{model}-ort_int8-{_key(source.name, _ort_version())}.onnx"
    )
    if path.exists():
        return path
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds: Iterator[dict] = iter(calibration_feeds(source))

        def get_next(self) -> dict | None:
            return next(self._feeds, None)

    partial = path.with_suffix(f".{os.getpid()}.partial.onnx")
    try:
        quantize_static(
            str(source),
            str(partial),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def modelopt_available() -> bool:
    return PEERS_PYTHON.exists() and (
        subprocess.run(
            [str(PEERS_PYTHON), "-c", "import modelopt.onnx.quantization"],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


def modelopt_quantized_path(model: str, mode: str) -> Path:
    """`model` quantized by ModelOpt's ONNX PTQ (`mode` "int8" or "fp8"), run in the peers venv."""
    import numpy as np

    if not PEERS_PYTHON.exists():
        raise RuntimeError(
            f"no peers venv at {PEERS_PYTHON}: python3 -m venv /work/venvs/peers && "
            "/work/venvs/peers/bin/pip install torch==2.13.0 'nvidia-modelopt[onnx]'"
        )
    source = float_path(model)
    directory = model_corpus.corpus_dir()
    path = directory / f"qdq-{model}-modelopt_{mode}-{_key(source.name, mode)}.onnx"
    if path.exists():
        return path
    feeds = calibration_feeds(source)
    calibration = path.with_suffix(".calib.npz")
    np.savez(calibration, **feeds[0])  # one sample: ModelOpt splits arrays on the batch axis
    partial = path.with_suffix(f".{os.getpid()}.partial.onnx")
    before = set(directory.iterdir())
    # A CalibrationDataReader, not `calibration_data`: ModelOpt splits arrays on their first
    # axis, which a 0-d timestep does not have; it also asks the reader for `get_first`.
    script = (
        "import sys, numpy as np\n"
        "from onnxruntime.quantization import CalibrationDataReader\n"
        "from modelopt.onnx.quantization import quantize\n"
        "class Reader(CalibrationDataReader):\n"
        "    def __init__(self):\n"
        "        self.first = dict(np.load(sys.argv[2]))\n"
        "        self.feeds = iter([self.first])\n"
        "    def get_first(self):\n"
        "        return self.first\n"
        "    def get_next(self):\n"
        "        return next(self.feeds, None)\n"
        "quantize(sys.argv[1], quantize_mode=sys.argv[4], calibration_data_reader=Reader(),\n"
        "         calibration_method='max', output_path=sys.argv[3],\n"
        "         calibration_eps=['cpu'])\n"
    )
    try:
        done = subprocess.run(
            [str(PEERS_PYTHON), "-c", script, str(source), str(calibration), str(partial), mode],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not partial.exists():
            raise RuntimeError(
                f"ModelOpt {mode} quantization of {model} failed:\n{done.stderr[-3000:]}"
            )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
        calibration.unlink(missing_ok=True)
        for leftover in set(directory.glob(f"{source.stem}_*.onnx")) - before:
            leftover.unlink()  # ModelOpt's intermediate files (_named, _opset19, ...)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modelopt", action="store_true", help="also quantize with ModelOpt")
    parser.add_argument("--only", nargs="*", default=MODELS, help="models to build")
    args = parser.parse_args(argv)
    for model in args.only:
        print(model, "float", float_path(model))
        print(model, "ort_int8", ort_quantized_path(model))
        if args.modelopt:
            for mode in ("int8", "fp8"):
                try:
                    print(model, f"modelopt_{mode}", modelopt_quantized_path(model, mode))
                except RuntimeError as exc:
                    print(model, f"modelopt_{mode}", "FAILED:", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
