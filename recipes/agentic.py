"""Train an agentic team: tools and a shared environment (the signalling game, a TextArena game, or your own).

    accelerate launch recipes/agentic.py                                 # tiny local model, the signalling game, CPU
    accelerate launch recipes/agentic.py --environment textarena:TicTacToe-v0 --num_turns 5 \
        --baseline raw --num_generations 1                               # the two agents play TicTacToe
    accelerate launch recipes/agentic.py --environment my_envs:make_env --dataset_name tasks.jsonl \
        --model_name_or_path Qwen/Qwen3-0.6B --max_completion_length 512 --max_tool_calling_iterations 4

Every field of `MAGRPOConfig` (and of `transformers.TrainingArguments`) is a flag; `--turn_order`,
`--max_tool_calling_iterations` and `--num_turns` shape the episodes (docs/agentic.md).
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("agentic", argv, description=__doc__)


if __name__ == "__main__":
    main()
