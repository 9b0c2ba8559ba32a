from mlflow_ngraph.commands.cli import main

main()
