from tvq_exp.tools.analysis.cli import main

main()
