"""grouprl: GRPO fine-tuning of language models, with PPO, TRPO and REINFORCE/RLOO baselines."""

__version__ = "0.1.0"
