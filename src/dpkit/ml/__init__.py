"""Private machine learning with scikit-learn-style estimators (fit, predict, score)."""
