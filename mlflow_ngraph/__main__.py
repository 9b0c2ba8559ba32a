from mlflow_ngraph.cli import main

main()
