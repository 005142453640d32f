"""A run's configuration: what the user asked for (options, environment variables), the recipe's two configs read
and checked (training arguments, the Accelerate config), and what follows from them (layout, adapter, precision, the
smoke and measurement profiles)."""
