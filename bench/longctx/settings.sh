# bench/longctx/settings.sh - the recomputation settings of bench/longctx
# (sourced by run.sh and plan.sh): recompute_options NAME prints the
# mc-train options of setting NAME (run.sh's usage lists the names).
recompute_options() {
    case $1 in
    none) ;;
    selective) echo --recompute-granularity selective ;;
    selective-mlp) echo --recompute-granularity selective --recompute-modules mlp ;;
    selective-all) echo --recompute-granularity selective --recompute-modules core_attn layernorm mlp ;;
    selective-cheap) echo --recompute-granularity selective --recompute-modules layernorm mlp_act attn_proj ;;
    full) echo --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ;;
    full-block-*) echo --recompute-granularity full --recompute-method block --recompute-num-layers "${1#full-block-}" ;;
    *) echo "${0##*/}: unknown setting $1" >&2; exit 1 ;;
    esac
}
