"""Train a team with MADPO (multi-agent DPO) on preferences collected from a built-in task.

    accelerate launch recipes/madpo.py                                   # tiny local model, coordination task, CPU
    accelerate launch recipes/madpo.py --task length_ratio --preference_num_candidates 8
    accelerate launch recipes/madpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-7 \
        --max_completion_length 128 --bf16 true --output_dir outputs/madpo-qwen
    accelerate launch recipes/madpo.py --collaboration_mode centralized  # one model writes every role
    accelerate launch recipes/madpo.py --config my_run.yaml

The trainer samples `preference_num_candidates` joint responses per item with the initial agents, scores them with the
task reward, keeps pairs (`pair_selection`), then trains `num_train_epochs` over them. Every field of `MADPOConfig`
is a flag.
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("madpo", argv, description=__doc__)


if __name__ == "__main__":
    main()
