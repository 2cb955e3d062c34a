#include <immintrin.h>
#include <chrono>
#include <cstdio>
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
template<int C> double run_bus(long iters){
  __m512i ai[C]; for(int i=0;i<C;i++) ai[i]=_mm512_set1_epi32(i);
  __m512i x=_mm512_set1_epi8(3), y=_mm512_set1_epi8(5);
  auto t0=std::chrono::steady_clock::now();
  for(long it=0;it<iters;it++){
    #pragma GCC unroll 32
    for(int i=0;i<C;i++) ai[i]=_mm512_dpbusd_epi32(ai[i],x,y);
  }
  auto t1=std::chrono::steady_clock::now();
  int s=0; for(int i=0;i<C;i++) s+=_mm512_reduce_add_epi32(ai[i]);
  if(s==42) printf("x");
  return iters*(double)C/std::chrono::duration<double>(t1-t0).count();
}
template<int C> double run_bf(long iters){
  __m512 ai[C]; for(int i=0;i<C;i++) ai[i]=_mm512_set1_ps(i);
  __m512bh x=(__m512bh)_mm512_set1_epi16(0x3f80);
  auto t0=std::chrono::steady_clock::now();
  for(long it=0;it<iters;it++){
    #pragma GCC unroll 32
    for(int i=0;i<C;i++) ai[i]=_mm512_dpbf16_ps(ai[i],x,x);
  }
  auto t1=std::chrono::steady_clock::now();
  float s=0; for(int i=0;i<C;i++) s+=_mm512_reduce_add_ps(ai[i]);
  if(s==42) printf("x");
  return iters*(double)C/std::chrono::duration<double>(t1-t0).count();
}
int main(){
  printf("dpbusd 8: %.2f G/s, 16: %.2f G/s\n", run_bus<8>(50000000)/1e9, run_bus<16>(25000000)/1e9);
  printf("dpbf16 8: %.2f G/s, 16: %.2f G/s\n", run_bf<8>(50000000)/1e9, run_bf<16>(25000000)/1e9);
}
