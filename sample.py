"""`python sample.py [key=value ...]`: see conf/sample.yaml and tvq_exp.run.sample."""

from tvq_exp.run.errors import run
from tvq_exp.run.sample import sample

if __name__ == "__main__":
    run("sample", sample)
