"""MLPerf LoadGen's scenarios on the tool's engines (``mlflow-ngraph loadgen``): the real
LoadGen (``mlcommons-loadgen``) drives each compiled engine, or a running ``serve``, through
SingleStream, MultiStream, Offline and Server; docs/loadgen.md."""
