"""Writers: where readings go (TensorBoard tags, writer and reader; JSON records; markdown). No math here."""
