#!/bin/bash
# written and submitted by nemo-run (SlurmExecutor): sbatch --requeue --parsable <this script>
#SBATCH --account=llm
#SBATCH --exclusive
#SBATCH --gres=gpu:8
#SBATCH --job-name=ckpteval-1a2b3c4d
#SBATCH --mem=0
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output='/lustre/me/ckpteval/nemo-run/ckpteval/<experiment>/1a2b3c4d/sbatch_ckpteval-1a2b3c4d_%j.out'
#SBATCH --partition=batch
#SBATCH --qos='high priority'
#SBATCH --time=04:00:00

# ... nemo-run's setup (head node address, environment) ...
srun --output /lustre/me/ckpteval/nemo-run/ckpteval/<experiment>/1a2b3c4d/log-ckpteval-1a2b3c4d_%j_${SLURM_RESTART_COUNT:-0}.out --chdir /lustre/me/ckpteval/nemo-run/ckpteval/<experiment>/1a2b3c4d/code --wait=60 --kill-on-bad-exit=1 --nodes=1 --ntasks=1 --overlap bash /lustre/me/ckpteval/evaluations/1a2b3c4d/job.sh
