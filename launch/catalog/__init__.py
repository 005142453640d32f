"""What is generated from the code: the recipe catalogue, README blocks and train.py copies, the floors of `launch/`."""
