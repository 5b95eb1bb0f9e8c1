"""The bundled demo model: training (`train`) and scoring (`eval`) on the handbook corpus."""
