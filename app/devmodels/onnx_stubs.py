"""The two ONNX front-end models of a random-weight model dir, written with ``onnx.helper``.

Deterministic stand-ins (functions of their input and the seed) with the real models' input and
output names, shapes and dtypes: the speaker embedding (``campplus.onnx``) and the speech
tokenizer (``speech_tokenizer_v*.onnx``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_campplus(path: Path, gen: Any) -> None:
    """Speaker-embedding stand-in: fbank [1,T,80] -> tanh(rms over time @ W) [1,192]."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    w = (torch.randn(80, 192, generator=gen) / 80**0.5).numpy()
    nodes = [
        helper.make_node("Mul", ["feats", "feats"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1], keepdims=0),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("MatMul", ["rms", "W"], ["proj"]),
        helper.make_node("Tanh", ["proj"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_campplus",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 192])],
        initializer=[
            numpy_helper.from_array(w, "W"),
            helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]),
        ],
    )
    _save_onnx(graph, path)


def write_speech_tokenizer(path: Path, stride: int, vocab: int, gen: Any) -> None:
    """Speech-tokenizer stand-in: whisper log-mel [1,128,T] (+ length) -> int64 ids [1, T // stride]."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    w = torch.randn(128, 1, generator=gen).numpy()
    i64 = lambda name, vals: helper.make_tensor(name, TensorProto.INT64, [len(vals)], vals)
    nodes = [
        helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
        helper.make_node("Shape", ["feats"], ["shape"]),
        helper.make_node("Slice", ["shape", "two", "three"], ["t"]),
        helper.make_node("Min", ["len64", "t"], ["tmin"]),
        helper.make_node("Div", ["tmin", "stride"], ["n"]),
        helper.make_node("Mul", ["n", "stride"], ["end"]),
        helper.make_node("Slice", ["feats", "zero", "end", "two"], ["cropped"]),
        helper.make_node("Concat", ["one", "c128", "n", "stride"], ["shape4"], axis=0),
        helper.make_node("Reshape", ["cropped", "shape4"], ["frames"]),
        helper.make_node("ReduceMean", ["frames"], ["pooled"], axes=[3], keepdims=0),
        helper.make_node("Transpose", ["pooled"], ["pooled_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["pooled_t", "W"], ["proj"]),
        helper.make_node("Mul", ["proj", "scale"], ["scaled"]),
        helper.make_node("Floor", ["scaled"], ["floored"]),
        helper.make_node("Cast", ["floored"], ["ids_raw"], to=TensorProto.INT64),
        helper.make_node("Mod", ["ids_raw", "vocab"], ["ids3"], fmod=0),
        helper.make_node("Squeeze", ["ids3", "two"], ["speech_token"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_speech_tokenizer",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("speech_token", TensorProto.INT64, [1, "N"])],
        initializer=[
            numpy_helper.from_array(w, "W"),
            helper.make_tensor("scale", TensorProto.FLOAT, [], [1000.0]),
            helper.make_tensor("vocab", TensorProto.INT64, [], [vocab]),
            i64("zero", [0]),
            i64("one", [1]),
            i64("two", [2]),
            i64("three", [3]),
            i64("stride", [stride]),
            i64("c128", [128]),
        ],
    )
    _save_onnx(graph, path)


def _save_onnx(graph: Any, path: Path) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="cosyserve-tiny",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
