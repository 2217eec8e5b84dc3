"""Engine-side glue: settings -> controller, the K lookup, the decision trace, the recorder."""
