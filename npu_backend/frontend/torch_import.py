"""PyTorch's ExportedProgram into Relax: TVM's importer, with the bias of a bfloat16 / float16
convolution or linear widened to the float32 its GEMM stores.

Stage: frontend (before normalise). In: a `torch.export.ExportedProgram`. Out: a Relax IRModule,
as `tvm.relax.frontend.torch.from_exported_program` makes it, the same arguments taken.

Why: TVM 0.27's importer writes every convolution, linear and addmm (a decomposed linear) as conv2d / matmul(...,
out_dtype="float32") then `add(result, bias)`; in a bfloat16 or float16 model the bias keeps the
model's dtype, so the add mixes float32 and bfloat16 and the importer raises (a bfloat16 ViT:
"Binary operators must have the same datatype ... R.add(lv, lv1)"). Here the bias is widened to
float32 (exact), added, and the sum rounded to the model's dtype, as PyTorch's layer returns it
(the next op, a concat with ViT's bfloat16 CLS token, needs that dtype); a layer without a bias
stays as TVM writes it (float32).
"""

from __future__ import annotations

from tvm import relax


def _widened_bias(bias, like):
    """`bias` as `like`'s dtype where the two differ (a 16-bit float bias of a float32 GEMM)."""
    if bias is None or not hasattr(bias, "ty") or not hasattr(like, "ty"):
        return bias
    if str(bias.ty.dtype) != str(like.ty.dtype) and str(like.ty.dtype) == "float32":
        return relax.op.astype(bias, "float32")
    return bias


def _as_model_dtype(builder, value, bias):
    """`value` (float32) rounded to the 16-bit float `bias` has, as PyTorch's own layer returns it
    (its float32 sum plus bias, rounded once: the GEMM's rounding store, normalise/half_casts.py)."""
    dtype = str(bias.ty.dtype) if hasattr(bias, "ty") else "float32"
    return value if dtype == "float32" else builder.emit(relax.op.astype(value, dtype))


def from_exported_program(exported_program, *args, **kwargs):
    """`tvm.relax.frontend.torch.from_exported_program(exported_program, ...)`, the bias of a
    16-bit float model's convolutions, linears and addmms widened to float32 and the biased
    result rounded to the model's dtype (the module docstring)."""
    from tvm.relax.frontend.torch import exported_program_translator as translator

    base = translator.ExportedProgramImporter

    class _Importer(base):
        def _conv2d_impl(self, x, weight, bias, *rest, **options):
            out = super()._conv2d_impl(x, weight, None, *rest, **options)
            return out if self._is_no_bias(bias) else self._add_bias(out, bias, 4)

        def _conv1d_impl(self, x, weight, bias, *rest, **options):
            out = super()._conv1d_impl(x, weight, None, *rest, **options)
            return out if self._is_no_bias(bias) else self._add_bias(out, bias, 3)

        def _linear(self, node):
            x, weight, *rest = self.retrieve_args(node)
            bias = rest[0] if rest else None
            out = self.block_builder.emit(relax.op.linear(x, weight, None, "float32"))
            if bias is None:
                return out
            added = self.block_builder.emit(relax.op.add(out, _widened_bias(bias, out)))
            return _as_model_dtype(self.block_builder, added, bias)

        def _addmm(self, node):
            bias, x, weight = (self.env[arg] for arg in node.args[:3])
            if str(bias.ty.dtype) == "float32" or node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("beta", 1) != 1:
                return super()._addmm(node)
            out = self.block_builder.emit(relax.op.matmul(x, weight, out_dtype="float32"))
            added = self.block_builder.emit(relax.op.add(_widened_bias(bias, out), out))
            return _as_model_dtype(self.block_builder, added, bias)

        def _add_bias(self, out, bias, rank):
            bias = relax.op.reshape(bias, (1, -1) + (1,) * (rank - 2))
            added = self.block_builder.emit(relax.op.add(out, _widened_bias(self.block_builder.emit(bias), out)))
            return _as_model_dtype(self.block_builder, added, bias)

    translator.ExportedProgramImporter = _Importer
    try:
        return translator.from_exported_program(exported_program, *args, **kwargs)
    finally:
        translator.ExportedProgramImporter = base
