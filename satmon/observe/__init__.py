"""Hook sets and device states: what is counted during a forward (saturation, offset, gate and
covariance statistics, the window's loss), kept on the activations' device with no host sync.
The screen and the probe drive them; they know nothing of either."""
