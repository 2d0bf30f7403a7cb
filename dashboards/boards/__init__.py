"""The five raypulse dashboards as panel data, in the order the link menu lists them."""

from __future__ import annotations

from dashboards.boards import cluster, gpu, job, node, training
from dashboards.model import Board

BOARDS: tuple[Board, ...] = (cluster.BOARD, job.BOARD, training.BOARD, node.BOARD, gpu.BOARD)
