"""Wolfpack's web view: watch games live as a spectator, replay trajectories turn by turn, follow a
training run's curves. A client of the environment service, the trajectory stream and run directories;
no service imports it."""
