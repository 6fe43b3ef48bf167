"""Writers: where readings go (TensorBoard through Lightning's loggers). No math here."""
