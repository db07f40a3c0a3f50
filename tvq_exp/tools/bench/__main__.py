from tvq_exp.tools.bench.cli import main

main()
