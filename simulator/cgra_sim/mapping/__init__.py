"""Mapping loop bodies onto the CGRA fabric: dataflow graphs (dfg.py), the intrinsics' bodies
(intrinsics.py), the modulo scheduler, placer and router (mapper.py, mrrg.py) and the
cycle-level array simulator that runs a mapping PE by PE (array_sim.py); the PE array's systolic
cell, whose mapping prices every GEMM and DEPTHWISE (pe_array.py). No tvm."""

from .dfg import DataflowGraph, GraphError, Node, Operand, rec_mii, res_mii
from .intrinsics import INTRINSICS
from .mapper import Mapping, MappingError, map_graph

__all__ = ["DataflowGraph", "GraphError", "Node", "Operand", "rec_mii", "res_mii", "INTRINSICS", "Mapping",
           "MappingError", "map_graph"]
