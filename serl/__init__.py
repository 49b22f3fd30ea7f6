"""serl: multi-turn RL for LLM agents (SERL, SPEAR, GRPO/GiGPO) on ALFWorld and WebShop."""

__version__ = "0.1.0"
