"""The six raypulse dashboards as panel data, in the order the link menu lists them."""

from __future__ import annotations

from dashboards.boards import cluster, gpu, job, node, rl, training
from dashboards.model import Board

BOARDS: tuple[Board, ...] = (cluster.BOARD, job.BOARD, training.BOARD, rl.BOARD, node.BOARD, gpu.BOARD)
