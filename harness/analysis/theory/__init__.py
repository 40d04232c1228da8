"""Theory beside measurement: the predicted speedup from acceptance and cost ratio (`speedup`), the crossover by load (`crossover`), speed of light for batch-1 decoding (`sol`)."""
