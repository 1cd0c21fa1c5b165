"""Agent workflows: one record in, one Trajectory out. Agents never import `memrl.rl`."""

from memrl.agents.trajectory import Trajectory, Turn

__all__ = ["Trajectory", "Turn"]
