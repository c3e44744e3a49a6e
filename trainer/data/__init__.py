"""DataFrame checks and Spark-side data preparation (Spark ML underneath)."""
