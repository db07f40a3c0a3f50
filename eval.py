"""`python eval.py [key=value ...]`: see conf/eval.yaml and tvq_exp.run.evaluate."""

from tvq_exp.run.errors import run
from tvq_exp.run.evaluate import evaluate

if __name__ == "__main__":
    run("eval", evaluate)
