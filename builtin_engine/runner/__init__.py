"""Running one scheduled step on the device: the batch built and run (`model_runner`), its
logits sampled (`sampler`), a whole CPU step compiled (`step_graph`), the decode step in CUDA
graphs (`decode_graph`), and the device, dtype, threads and compile cache it runs with."""
