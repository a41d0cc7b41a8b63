"""Small, pure environments for checking the MARL math on problems whose optimum is known."""

from trl_marl.envs.gridworld import ACTIONS, MOVES, OPTIMAL_STEPS, RACE, GridConfig, GridWorld, crashes, propose_moves

__all__ = ["ACTIONS", "MOVES", "OPTIMAL_STEPS", "RACE", "GridConfig", "GridWorld", "crashes", "propose_moves"]
